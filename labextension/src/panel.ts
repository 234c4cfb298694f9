/**
 * The "Elastic jobs" side panel: a live table of every job on this server.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { FINAL, POLL_MS, ago, cellsRow, duration, el, lastDisruption, pollInterval, sig, sparkline, speedParts, trackingRow } from './format';
import type { IJobRow, IJobsReply } from './contract';
import { listJobs, stopJob } from './request';

/** What a refresh found: the jobs, or why the server could not be asked. */
export interface IRefreshed {
  jobs: IJobRow[];
  failure: string | null;
}

export type Filter = 'all' | 'running' | 'finished';

export class JobsPanel extends Widget {
  private _jobs: IJobRow[] = [];
  private _errors: IJobsReply['errors'] = {};
  private _failure: string | null = null;
  private _filter: Filter = 'all';
  private _poll: Poll | null = null;
  private _body: HTMLElement;
  private _banner: HTMLElement;
  private _refreshed = new Signal<this, IRefreshed>(this);

  constructor(private _openNotebook: (path: string) => void) {
    super();
    this.id = 'notebook-elastic-panel';
    this.addClass('ne-panel');
    this.title.caption = 'Elastic jobs';
    const head = el('div', { class: 'ne-panel-head' });
    head.appendChild(el('span', { class: 'ne-panel-title' }, 'Elastic jobs'));
    const filter = el('select', { class: 'ne-filter', 'aria-label': 'filter jobs' });
    for (const f of ['all', 'running', 'finished']) {
      filter.appendChild(el('option', { value: f }, f));
    }
    filter.addEventListener('change', () => {
      this._filter = filter.value as Filter;
      this.render();
    });
    head.appendChild(filter);
    this._banner = el('div', { class: 'ne-banner' });
    this._body = el('div', { class: 'ne-panel-body' });
    this.node.append(head, this._banner, this._body);
    this.start();
  }

  get jobs(): IJobRow[] {
    return this._jobs;
  }

  /** Emitted after every refresh (the status bar item listens). */
  get refreshed(): ISignal<this, IRefreshed> {
    return this._refreshed;
  }

  /**
   * Ask the server every 2 s while a job lives, every 10 s when none does; after a failure,
   * less and less often (up to a minute); not at all while the page is hidden (Lumino's Poll).
   */
  start(): void {
    if (this._poll !== null) {
      return;
    }
    this._poll = new Poll({
      factory: async () => {
        await this.refresh();
        if (this._failure) {
          throw new Error(this._failure); // the Poll backs off
        }
      },
      frequency: { interval: POLL_MS.live, backoff: true, max: POLL_MS.max },
      standby: 'when-hidden',
      name: 'notebook-elastic:jobs'
    });
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll?.dispose();
    this._poll = null;
    Signal.clearData(this);
    super.dispose();
  }

  async refresh(): Promise<void> {
    try {
      const reply: IJobsReply = await listJobs();
      this._jobs = reply.jobs;
      this._errors = reply.errors || {};
      this._failure = null;
    } catch (error) {
      this._failure =
        'The notebook-elastic server extension does not answer: ' +
        String((error as Error).message || error) +
        '. Check that it is installed and enabled (jupyter server extension list), then reload.';
    }
    this.render();
    if (this._poll && !this._failure) {
      const interval = pollInterval(this._jobs);
      if (this._poll.frequency.interval !== interval) {
        this._poll.frequency = { ...this._poll.frequency, interval };
      }
    }
    this._refreshed.emit({ jobs: this._jobs, failure: this._failure });
  }

  async stopAll(): Promise<void> {
    const live = this._jobs.filter(j => !FINAL.has(j.status));
    if (live.length === 0) {
      return;
    }
    const answer = await showDialog({
      title: `Stop ${live.length} elastic job${live.length > 1 ? 's' : ''}?`,
      body: `${live.map(j => j.name).join(', ')}: every process or pod they started is stopped.`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop all' })]
    });
    if (answer.button.accept) {
      await Promise.all(live.map(j => stopJob(j).catch(() => null)));
      await this.refresh();
    }
  }

  private async _stop(job: IJobRow, button: HTMLButtonElement): Promise<void> {
    const answer = await showDialog({
      title: `Stop ${job.name}?`,
      body: `Every ${job.backend === 'kubernetes' ? 'pod' : 'process'} of this job is stopped. Its checkpoints stay.`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop' })]
    });
    if (!answer.button.accept) {
      return;
    }
    button.disabled = true;
    button.textContent = 'stopping…';
    try {
      await stopJob(job);
    } catch (error) {
      this._banner.textContent = `Could not stop ${job.name}: ${(error as Error).message}`;
    }
    await this.refresh();
  }

  render(): void {
    this._banner.textContent = '';
    this._banner.classList.toggle('ne-visible', false);
    const problems = [this._failure, ...Object.entries(this._errors).map(([b, e]) => `${b}: ${e}`)].filter(Boolean);
    if (problems.length) {
      this._banner.textContent = problems.join(' ');
      this._banner.classList.toggle('ne-visible', true);
    }
    this._body.textContent = '';
    // In the order GET /jobs gives: what needs attention first, newest first within a status
    // (backends/base.py attention_order, the same for jobs() and %elastic_jobs).
    const shown = this._jobs.filter(j =>
      this._filter === 'all' ? true : this._filter === 'running' ? !FINAL.has(j.status) : FINAL.has(j.status)
    );
    if (!shown.length) {
      this._body.appendChild(
        el('div', { class: 'ne-empty' }, this._failure ? '' : this._jobs.length ? 'No job matches the filter.' : 'No elastic jobs yet. Start one with %%elastic_train in a notebook.')
      );
      return;
    }
    const list = el('div', { class: 'ne-jobs' });
    for (const job of shown) {
      const history = job.transitions || [];
      const card = el('div', {
        class: 'ne-job',
        'data-name': job.name,
        'data-status': job.status,
        'data-history': history.map(t => t.status).join(',')
      });
      const top = el('div', { class: 'ne-job-top' });
      const link = el('a', { href: '#', class: 'ne-job-name', title: job.notebook ? `open ${job.notebook}` : 'the launching notebook is unknown' }, job.name);
      link.addEventListener('click', event => {
        event.preventDefault();
        if (job.notebook) {
          this._openNotebook(job.notebook);
        }
      });
      top.appendChild(link);
      top.appendChild(el('span', { class: `ne-badge ne-status-${job.status}`, title: [job.damaged || job.reason, `${job.backend} backend`].filter(Boolean).join(' · ') }, job.status));
      const spacer = el('span', { class: 'ne-spacer' });
      top.appendChild(spacer);
      if (!FINAL.has(job.status)) {
        const stop = el('button', { class: 'ne-stop jp-Button', title: `stop ${job.name}` }, 'Stop');
        stop.addEventListener('click', () => void this._stop(job, stop));
        top.appendChild(stop);
      }
      card.appendChild(top);
      const finished = FINAL.has(job.status);
      const stats = [
        // A finished job has no nodes now: its last size and its range are what it was.
        finished ? `last world ${job.world_size || '–'}` : `world ${job.world_size || '–'}`,
        finished
          ? `range ${job.min_nodes ?? '?'}:${job.max_nodes ?? '?'}`
          : `nodes ${job.nodes_running ?? 0} (${job.min_nodes ?? '?'}:${job.max_nodes ?? '?'})`,
        `restarts ${job.restarts ?? 0}/${job.max_restarts ?? '?'}`,
        job.step === null || job.step === undefined ? '' : `step ${job.step}${job.total_steps ? '/' + job.total_steps : ''}`
      ].filter(Boolean);
      // Each value on one line: the row wraps between values, never inside one ("step" / "48/100").
      card.appendChild(cellsRow('ne-sub ne-stats', stats));
      const bottom = el('div', { class: 'ne-job-bottom' });
      bottom.appendChild(sparkline(job.loss_tail || [], 110, 18));
      const loss = job.loss === null || job.loss === undefined ? '' : `loss ${sig(job.loss, 4)}`;
      // How long it ran leaves out the time it sat stopped before a resume (JobState.ran_s).
      const ran = job.ran_s ?? (job.finished_at && job.started_at ? job.finished_at - job.started_at : null);
      const when = finished && job.finished_at ? [`ran ${duration(ran)}`, `ended ${ago(job.finished_at)}`] : [`started ${ago(job.started_at)}`];
      // The backend only where it is not the local one: a word on every row of a short card.
      const where = job.backend === 'local' ? '' : job.backend;
      bottom.appendChild(cellsRow('ne-sub ne-when', [loss, where, ...when].filter(Boolean)));
      card.appendChild(bottom);
      const speed = speedParts(job);
      if (speed.length && !FINAL.has(job.status)) {
        card.appendChild(cellsRow('ne-sub ne-speed', speed));
      }
      for (const alert of [job.waiting, job.stall, job.warning]) {
        if (alert && !FINAL.has(job.status)) {
          card.appendChild(el('div', { class: 'ne-sub ne-waiting', title: alert }, alert));
        }
      }
      const disruption = lastDisruption(history, finished);
      if (disruption) {
        const kind = finished ? 'ne-history' : 'ne-disruption';
        card.appendChild(el('div', { class: `ne-sub ${kind}`, title: disruption.detail }, disruption.text));
      }
      const tracking = trackingRow(job.tracking || []);
      if (tracking) {
        card.appendChild(tracking);
      }
      if (job.damaged || (job.reason && FINAL.has(job.status))) {
        card.appendChild(el('div', { class: 'ne-sub ne-reason' }, job.damaged || job.reason || ''));
      }
      list.appendChild(card);
    }
    this._body.appendChild(list);
  }

}
