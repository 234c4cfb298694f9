/**
 * The "Elastic jobs" side panel: a live table of every job on this server.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { IJob, IJobsReply, ITracking, ITransition, listJobs, stopJob } from './request';

const POLL_MS = 2000;
const FINAL = new Set(['succeeded', 'failed', 'stopped', 'lost', 'damaged']);

export type Filter = 'all' | 'running' | 'finished';

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: { [key: string]: string } = {},
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    node.setAttribute(k, v);
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** "0.21 s/step · 1.52k samples/s · GPU peak 31.2 GiB · 87% busy": what GPU users read first. */
function speedText(job: IJob): string {
  const perS = (v: number | null | undefined, unit: string): string => {
    if (v === null || v === undefined || !isFinite(v)) {
      return '';
    }
    for (const [scale, suffix] of [[1e9, 'G'], [1e6, 'M'], [1e3, 'k']] as [number, string][]) {
      if (v >= scale) {
        return `${(v / scale).toPrecision(3)}${suffix} ${unit}/s`;
      }
    }
    return `${v.toPrecision(3)} ${unit}/s`;
  };
  const parts: string[] = [];
  if (job.step_time_s) {
    parts.push(`${job.step_time_s.toPrecision(3)} s/step`);
  }
  parts.push(perS(job.samples_per_s, 'samples'), perS(job.tokens_per_s, 'tokens'));
  if (job.gpu_mem_peak_bytes) {
    parts.push(`GPU peak ${(job.gpu_mem_peak_bytes / 2 ** 30).toFixed(1)} GiB`);
  }
  if (job.gpu_util_percent !== null && job.gpu_util_percent !== undefined) {
    parts.push(`${Math.round(job.gpu_util_percent)}% busy`);
  }
  return parts.filter(Boolean).join(' · ');
}

/** "MLflow run 3f2a · TensorBoard: tensorboard --logdir ...": a link to each run's page, else the
 * command that shows it (selectable), built as text nodes; only http(s) links. */
function trackingRow(tracking: ITracking[]): HTMLElement | null {
  if (!tracking.length) {
    return null;
  }
  const row = el('div', { class: 'ne-sub ne-tracking' });
  tracking.forEach((t, i) => {
    if (i) {
      row.appendChild(document.createTextNode(' · '));
    }
    if (t.url && /^https?:\/\//.test(t.url)) {
      row.appendChild(
        el('a', { class: 'ne-tracking-link', 'data-tracker': t.tracker, href: t.url, target: '_blank', rel: 'noopener noreferrer', title: t.url }, t.label)
      );
    } else if (t.command) {
      const item = el('span', { class: 'ne-tracking-item', 'data-tracker': t.tracker, title: t.path ? `${t.label} in ${t.path}` : t.label }, `${t.label}: `);
      item.appendChild(wrappable(el('code', { class: 'ne-tracking-command' }), t.command));
      row.appendChild(item);
    }
  });
  return row;
}

/**
 * A command or a path that a narrow panel breaks after a '/' or at a space, never inside a name
 * (at its hyphens): each name between slashes an unbreakable piece, each slash a place to break.
 */
export function wrappable(into: HTMLElement, text: string): HTMLElement {
  text.split(/(\s+)/).forEach(token => {
    if (!token || /^\s+$/.test(token)) {
      into.appendChild(document.createTextNode(token));
      return;
    }
    token.split('/').forEach((seg, i) => {
      if (i) {
        into.appendChild(document.createTextNode('/'));
        into.appendChild(document.createElement('wbr'));
      }
      if (seg) {
        into.appendChild(el('span', { class: 'ne-path-seg' }, seg));
      }
    });
  });
  return into;
}

/** A small SVG line of the latest losses. */
export function sparkline(values: number[], width = 80, height = 18): SVGSVGElement {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'ne-sparkline');
  svg.setAttribute('width', String(width));
  svg.setAttribute('height', String(height));
  svg.setAttribute('data-points', String(values.length));
  const finite = values.filter(v => Number.isFinite(v));
  if (finite.length < 2) {
    return svg;
  }
  const lo = Math.min(...finite);
  const hi = Math.max(...finite);
  const span = hi - lo || 1;
  const points = finite
    .map((v, i) => {
      const x = (i / (finite.length - 1)) * (width - 2) + 1;
      const y = height - 1 - ((v - lo) / span) * (height - 2);
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    })
    .join(' ');
  const line = document.createElementNS(ns, 'polyline');
  line.setAttribute('points', points);
  line.setAttribute('fill', 'none');
  line.setAttribute('stroke', 'var(--jp-brand-color1, #1976d2)');
  line.setAttribute('stroke-width', '1.2');
  svg.appendChild(line);
  return svg;
}

function duration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${s % 60} s`;
  }
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

function ago(seconds: number | null): string {
  if (!seconds) {
    return '';
  }
  const s = Math.max(0, Date.now() / 1000 - seconds);
  if (s < 60) {
    return `${Math.round(s)}s ago`;
  }
  if (s < 3600) {
    return `${Math.round(s / 60)}m ago`;
  }
  return `${Math.round(s / 3600)}h ago`;
}

/**
 * The latest restart and how it healed: "restarting 12s ago: node-1 left (preempted) ·
 * running again after 1.8 s". A restart shorter than the poll interval never shows in the
 * badge, so the row says it happened.
 */
export function lastDisruption(history: ITransition[], finished = false): { text: string; detail: string } | null {
  let i = history.length - 1;
  while (i >= 0 && history[i].status !== 'restarting') {
    i--;
  }
  if (i < 0) {
    return null;
  }
  const start = history[i];
  const healed = history.slice(i + 1).find(t => t.status === 'running');
  const cause = start.cause.length > 120 ? start.cause.slice(0, 119) + '…' : start.cause;
  // A finished job's restarts are its history, not its present: said as such, in calm colours.
  const text = finished ? `last restart ${ago(start.at)}: ${cause}` : `restarting ${ago(start.at)}: ${cause}`;
  return {
    text: healed ? `${text} · running again after ${(healed.at - start.at).toFixed(1)} s` : text,
    detail: (start.events || [start.cause]).join('\n')
  };
}

export class JobsPanel extends Widget {
  private _jobs: IJob[] = [];
  private _errors: { [k: string]: string } = {};
  private _failure: string | null = null;
  private _filter: Filter = 'all';
  private _timer: number | null = null;
  private _body: HTMLElement;
  private _banner: HTMLElement;
  private _listeners: Array<(jobs: IJob[], failure: string | null) => void> = [];

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

  get jobs(): IJob[] {
    return this._jobs;
  }

  /** Called with every refresh (the status bar item listens). */
  onRefresh(listener: (jobs: IJob[], failure: string | null) => void): void {
    this._listeners.push(listener);
  }

  start(): void {
    if (this._timer === null) {
      void this.refresh();
      this._timer = window.setInterval(() => void this.refresh(), POLL_MS);
    }
  }

  dispose(): void {
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
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
    for (const listener of this._listeners) {
      listener(this._jobs, this._failure);
    }
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

  private async _stop(job: IJob, button: HTMLButtonElement): Promise<void> {
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
      top.appendChild(el('span', { class: `ne-badge ne-status-${job.status}`, title: job.damaged || job.reason || '' }, job.status));
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
      const statsRow = el('div', { class: 'ne-sub ne-stats' });
      stats.forEach((value, i) => {
        if (i) {
          statsRow.appendChild(document.createTextNode(' · '));
        }
        statsRow.appendChild(el('span', { class: 'ne-cell' }, value));
      });
      card.appendChild(statsRow);
      const bottom = el('div', { class: 'ne-job-bottom' });
      bottom.appendChild(sparkline(job.loss_tail || [], 110, 18));
      const loss = job.loss === null || job.loss === undefined ? '' : `loss ${job.loss.toPrecision(4)}`;
      const when =
        finished && job.finished_at && job.started_at
          ? `ran ${duration(job.finished_at - job.started_at)}, ended ${ago(job.finished_at)}`
          : `started ${ago(job.started_at)}`;
      bottom.appendChild(el('span', { class: 'ne-sub ne-when' }, [loss, `${job.backend} · ${when}`].filter(Boolean).join(' · ')));
      card.appendChild(bottom);
      const speed = speedText(job);
      if (speed && !FINAL.has(job.status)) {
        card.appendChild(el('div', { class: 'ne-sub ne-speed' }, speed));
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
