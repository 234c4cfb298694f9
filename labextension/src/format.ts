/**
 * What the panel and the status bar say, as plain functions of the jobs the server lists: no
 * JupyterLab import, so the unit tests (test/) run them in a bare DOM.
 *
 * The numbers (durations, significant digits, rates, memory) follow the rules of the Python
 * views (notebook_elastic/contract/words.py), implemented here once more: both test suites read
 * one table of cases, tests/data/words.json (#39 item 4).
 */
import type { IJobRow, ITracking, ITransition } from './contract';

export const FINAL = new Set(['succeeded', 'failed', 'stopped', 'lost', 'damaged']);

/** How often the panel asks the server: often while a job lives, seldom when none does. */
export const POLL_MS = { live: 2000, idle: 10000, max: 60000 };

/** The panel's poll interval for these jobs (backing off after failures is the Poll's own). */
export function pollInterval(jobs: IJobRow[]): number {
  return jobs.some(j => !FINAL.has(j.status)) ? POLL_MS.live : POLL_MS.idle;
}

export function el<K extends keyof HTMLElementTagNameMap>(
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

/** A row of values separated by " · ", each value a nowrap cell: the row wraps between values,
 * never inside one ("ran 1" / "min 44 s" at a normal width, #39 item 9). */
export function cellsRow(cls: string, values: string[]): HTMLElement {
  const row = el('div', { class: cls });
  values.forEach((value, i) => {
    if (i) {
      row.appendChild(document.createTextNode(' · '));
    }
    row.appendChild(el('span', { class: 'ne-cell' }, value));
  });
  return row;
}

/** "2 elastic jobs · 1 restarting" */
export function statusText(jobs: IJobRow[]): string {
  const live = jobs.filter(j => ['pending', 'running', 'restarting'].includes(j.status));
  if (!live.length) {
    return '';
  }
  const restarting = live.filter(j => j.status === 'restarting').length;
  let text = `${live.length} elastic job${live.length > 1 ? 's' : ''}`;
  if (restarting) {
    text += ` · ${restarting} restarting`;
  }
  return text;
}

/** Rounded half up, as words.py's _half_up: the two languages round alike. */
function halfUp(x: number): number {
  return Math.floor(x + 0.5);
}

/** Every duration: "0.8s" under ten seconds, "42s", "3m 05s", "2h 10m"; a dash when unknown. */
export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) {
    return '–';
  }
  const s = Math.max(0, seconds);
  const tenths = halfUp(s * 10);
  if (tenths < 100) {
    return `${Math.floor(tenths / 10)}.${tenths % 10}s`;
  }
  const whole = halfUp(s);
  const two = (n: number): string => String(n).padStart(2, '0');
  if (whole < 60) {
    return `${whole}s`;
  }
  if (whole < 3600) {
    return `${Math.floor(whole / 60)}m ${two(whole % 60)}s`;
  }
  return `${Math.floor(whole / 3600)}h ${two(Math.floor((whole % 3600) / 60))}m`;
}

/** A number to `digits` significant digits, trailing zeros dropped: Python's "%g" (words.sig). */
export function sig(value: number, digits: number): string {
  if (!Number.isFinite(value)) {
    return Number.isNaN(value) ? 'nan' : value > 0 ? 'inf' : '-inf';
  }
  if (value === 0) {
    return '0';
  }
  const [mantissa, exp] = value.toExponential(digits - 1).split('e');
  const e = Number(exp);
  const trim = (text: string): string => (text.includes('.') ? text.replace(/0+$/, '').replace(/\.$/, '') : text);
  if (e < -4 || e >= digits) {
    return `${trim(mantissa)}e${e < 0 ? '-' : '+'}${String(Math.abs(e)).padStart(2, '0')}`;
  }
  return trim(value.toFixed(Math.max(0, digits - 1 - e)));
}

/** "1.52k samples/s", "35 tokens/s" (words.rate). */
export function rate(perS: number | null | undefined, unit: string): string {
  if (perS === null || perS === undefined || !Number.isFinite(perS)) {
    return '–';
  }
  for (const [scale, suffix] of [[1e9, 'G'], [1e6, 'M'], [1e3, 'k']] as [number, string][]) {
    if (perS >= scale) {
      return `${sig(perS / scale, 3)}${suffix} ${unit}/s`;
    }
  }
  return `${sig(perS, 3)} ${unit}/s`;
}

/** Bytes as people read GPU memory: "1.5 GiB", "300 MiB" (words.gib). */
export function gib(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) {
    return '–';
  }
  return n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(1)} GiB` : `${(n / 2 ** 20).toFixed(0)} MiB`;
}

/** A status as a sentence says it: "has succeeded", "was stopped", "is running" (words.status_phrase). */
export function statusPhrase(status: string): string {
  const phrases: { [s: string]: string } = {
    succeeded: 'has succeeded',
    failed: 'has failed',
    stopped: 'was stopped',
    lost: 'is lost',
    damaged: 'is damaged'
  };
  return phrases[status] ?? `is ${status}`;
}

/** "0.204 s/step · 1.52k samples/s · GPU peak 31.2 GiB · 87% busy": what GPU users read first,
 * each value a piece of its own (the row wraps between them, never inside one). */
export function speedParts(job: IJobRow): string[] {
  const parts: string[] = [];
  if (job.step_time_s) {
    parts.push(`${sig(job.step_time_s, 3)} s/step`);
  }
  const rates: [number | null, string][] = [
    [job.samples_per_s, 'samples'],
    [job.tokens_per_s, 'tokens']
  ];
  for (const [v, unit] of rates) {
    if (v !== null && v !== undefined && Number.isFinite(v)) {
      parts.push(rate(v, unit));
    }
  }
  if (job.gpu_mem_peak_bytes) {
    parts.push(`GPU peak ${gib(job.gpu_mem_peak_bytes)}`);
  }
  if (job.gpu_util_percent !== null && job.gpu_util_percent !== undefined) {
    parts.push(`${Math.round(job.gpu_util_percent)}% busy`);
  }
  return parts;
}

export function speedText(job: IJobRow): string {
  return speedParts(job).join(' · ');
}

/** "MLflow run 3f2a · TensorBoard: tensorboard --logdir ...": a link to each run's page, else the
 * command that shows it (selectable), built as text nodes; only http(s) links. */
export function trackingRow(tracking: ITracking[]): HTMLElement | null {
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
      const item = el('span', { class: 'ne-tracking-item', 'data-tracker': t.tracker, title: t.command }, `${t.label}: `);
      // One line, cut with an ellipsis in a narrow panel; the whole command selects at a click
      // and is the item's title (Chromium breaks at a <wbr> even in a nowrap line: the command
      // wrapped over four lines, and a card was 230 px, #39 item 9).
      item.appendChild(el('code', { class: 'ne-tracking-command' }, t.command));
      row.appendChild(item);
    }
  });
  return row;
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

export function ago(seconds: number | null, now: number = Date.now() / 1000): string {
  if (!seconds) {
    return '';
  }
  const s = Math.max(0, now - seconds);
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
  // The outage counts from its cause (the drill, else the departure: the fold's `since`), as the
  // dashboard's timeline counts "back at world size N after ..." (#39 item 4).
  const since = start.since ?? start.at;
  // A finished job's restarts are its history, not its present: said as such, in calm colours.
  // A change in place restarted nothing (#41 item 7): "restart" only where one happened.
  const what = start.in_place
    ? finished
      ? 'last change in place'
      : 'changed in place'
    : finished
      ? 'last restart'
      : 'restarting';
  const text = `${what} ${ago(since)}: ${cause}`;
  return {
    text: healed ? `${text} · running again after ${duration(healed.at - since)}` : text,
    detail: (start.events || [start.cause]).join('\n')
  };
}

