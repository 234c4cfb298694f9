/**
 * The panel's and the status bar's words, from the jobs the server lists (src/format.ts).
 */
import { describe, expect, it } from 'vitest';

import { ago, duration, lastDisruption, pollInterval, POLL_MS, sparkline, speedText, statusText, trackingRow, wrappable } from '../src/format';
import type { IJob, ITransition } from '../src/request';

function job(overrides: Partial<IJob>): IJob {
  return { name: 'toy', backend: 'local', status: 'running', ...overrides } as IJob;
}

describe('statusText', () => {
  it('counts the live jobs and says how many restart', () => {
    expect(statusText([])).toBe('');
    expect(statusText([job({ status: 'succeeded' })])).toBe('');
    expect(statusText([job({}), job({ status: 'restarting' }), job({ status: 'failed' })])).toBe(
      '2 elastic jobs · 1 restarting'
    );
    expect(statusText([job({ status: 'pending' })])).toBe('1 elastic job');
  });
});

describe('pollInterval', () => {
  it('asks often while a job lives, seldom when none does', () => {
    expect(pollInterval([job({})])).toBe(POLL_MS.live);
    expect(pollInterval([job({ status: 'stopped' }), job({ status: 'lost' })])).toBe(POLL_MS.idle);
    expect(pollInterval([])).toBe(POLL_MS.idle);
  });
});

describe('lastDisruption', () => {
  const history: ITransition[] = [
    { status: 'running', at: 100, cause: 'started' },
    { status: 'restarting', at: 110, cause: 'node-1 left (preempted)', events: ['node-1 left', 'peer lost'] },
    { status: 'running', at: 111.8, cause: 'regrouped' }
  ] as ITransition[];

  it('says the latest restart and how long it took to heal', () => {
    const said = lastDisruption(history);
    expect(said?.text).toMatch(/^restarting \d+[smh] ago: node-1 left \(preempted\) · running again after 1\.8 s$/);
    expect(said?.detail).toBe('node-1 left\npeer lost');
  });

  it('calls a finished job\'s restart its history', () => {
    expect(lastDisruption(history, true)?.text).toMatch(/^last restart /);
  });

  it('says nothing when the job never restarted', () => {
    expect(lastDisruption([{ status: 'running', at: 1, cause: '' } as ITransition])).toBeNull();
  });
});

describe('time words', () => {
  it('says durations and ages as people do', () => {
    expect(duration(42)).toBe('42 s');
    expect(duration(125)).toBe('2 min 5 s');
    expect(duration(7260)).toBe('2 h 1 min');
    expect(ago(null)).toBe('');
    expect(ago(1000, 1008)).toBe('8s ago');
    expect(ago(1000, 1000 + 5 * 60)).toBe('5m ago');
  });
});

describe('speedText', () => {
  it('gives step time, throughput and GPU memory in short units', () => {
    const text = speedText(job({ step_time_s: 0.21, samples_per_s: 1520, gpu_mem_peak_bytes: 31.2 * 2 ** 30, gpu_util_percent: 87.4 }));
    expect(text).toBe('0.210 s/step · 1.52k samples/s · GPU peak 31.2 GiB · 87% busy');
    expect(speedText(job({}))).toBe('');
  });
});

describe('wrappable', () => {
  it('breaks a path after each slash, never inside a name', () => {
    const node = wrappable(document.createElement('code'), 'tensorboard --logdir /home/a-b/jobs/my-job');
    expect(node.textContent).toBe('tensorboard --logdir /home/a-b/jobs/my-job');
    const pieces = Array.from(node.querySelectorAll('.ne-path-seg')).map(n => n.textContent);
    expect(pieces).toEqual(['tensorboard', '--logdir', 'home', 'a-b', 'jobs', 'my-job']);
    expect(node.querySelectorAll('wbr').length).toBe(4); // one after each of the 4 slashes
  });
});

describe('trackingRow', () => {
  it('links only http(s) pages, and shows a command otherwise', () => {
    const row = trackingRow([
      { tracker: 'mlflow', label: 'MLflow run 3f2a', url: 'https://mlflow.example/r/3f2a' },
      { tracker: 'evil', label: 'click me', url: 'javascript:alert(1)' },
      { tracker: 'tensorboard', label: 'TensorBoard', command: 'tensorboard --logdir /j/toy', path: '/j/toy' }
    ] as never);
    expect(row?.querySelectorAll('a').length).toBe(1);
    expect(row?.querySelector('a')?.getAttribute('href')).toBe('https://mlflow.example/r/3f2a');
    expect(row?.querySelector('a')?.getAttribute('rel')).toBe('noopener noreferrer');
    expect(row?.querySelector('.ne-tracking-command')?.textContent).toBe('tensorboard --logdir /j/toy');
    expect(trackingRow([])).toBeNull();
  });
});

describe('sparkline', () => {
  it('draws the finite losses, and nothing from fewer than two', () => {
    const svg = sparkline([1, 0.5, NaN, 0.25], 80, 18);
    expect(svg.getAttribute('data-points')).toBe('4');
    const points = svg.querySelector('polyline')?.getAttribute('points')?.split(' ');
    expect(points?.length).toBe(3);
    expect(points?.[0]).toBe('1.0,1.0');
    expect(sparkline([1]).querySelector('polyline')).toBeNull();
  });
});
