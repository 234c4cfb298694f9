/**
 * The panel's and the status bar's words, from the jobs the server lists (src/format.ts).
 */
import { readFileSync } from 'fs';
import { resolve } from 'path';
import { describe, expect, it } from 'vitest';

import { ago, cellsRow, duration, gib, lastDisruption, pollInterval, POLL_MS, rate, sig, sparkline, speedText, statusPhrase, statusText, trackingRow } from '../src/format';
import type { IJobRow, ITransition } from '../src/contract';
import { row } from './rows';

// The numbers every view writes: the same table the Python views are tested with
// (tests/test_words.py), so the panel and the dashboard cannot write one number two ways.
type Case = (number | string | null)[];
const TABLE = JSON.parse(readFileSync(resolve(__dirname, '../../tests/data/words.json'), 'utf-8')) as { [rule: string]: Case[] };
const num = (v: number | string | null): number | null => (v === 'NaN' ? NaN : (v as number | null));

describe('the shared table of numbers (tests/data/words.json)', () => {
  it.each(TABLE.duration)('duration(%s) is %s', (seconds, said) => {
    expect(duration(num(seconds))).toBe(said);
  });
  it.each(TABLE.sig)('sig(%s, %s) is %s', (value, digits, said) => {
    expect(sig(value as number, digits as number)).toBe(said);
  });
  it.each(TABLE.rate)('rate(%s, %s) is %s', (perS, unit, said) => {
    expect(rate(num(perS), unit as string)).toBe(said);
  });
  it.each(TABLE.gib)('gib(%s) is %s', (n, said) => {
    expect(gib(num(n))).toBe(said);
  });
  it.each(TABLE.status_phrase)('statusPhrase(%s) is %s', (status, said) => {
    expect(statusPhrase(status as string)).toBe(said);
  });
  it('has every rule and cases for each', () => {
    for (const rule of ['duration', 'sig', 'rate', 'gib', 'status_phrase']) {
      expect(TABLE[rule].length).toBeGreaterThan(3);
    }
  });
});

function job(overrides: Partial<IJobRow>): IJobRow {
  return row(overrides);
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
  ];

  it('says the latest restart and how long it took to heal', () => {
    const said = lastDisruption(history);
    expect(said?.text).toMatch(/^restarting \d+[smh] ago: node-1 left \(preempted\) · running again after 1\.8s$/);
    expect(said?.detail).toBe('node-1 left\npeer lost');
  });

  it('counts the outage from its cause (the fold\'s since), as the dashboard\'s timeline does', () => {
    const drilled: ITransition[] = [history[0], { ...history[1], at: 110.3, since: 110 }, history[2]];
    expect(lastDisruption(drilled)?.text).toMatch(/ · running again after 1\.8s$/);
  });

  it('calls a finished job\'s restart its history', () => {
    expect(lastDisruption(history, true)?.text).toMatch(/^last restart /);
  });

  it('calls a change in place what it was: no process restarted (#41 item 7)', () => {
    const kept: ITransition[] = [history[0], { ...history[1], in_place: true }, history[2]];
    expect(lastDisruption(kept)?.text).toMatch(/^changed in place \d+[smh] ago: node-1 left \(preempted\) · running again after 1\.8s$/);
    expect(lastDisruption(kept, true)?.text).toMatch(/^last change in place /);
    expect(lastDisruption(kept, true)?.text).not.toMatch(/restart/);
  });

  it('says nothing when the job never restarted', () => {
    expect(lastDisruption([{ status: 'running', at: 1, cause: '' }])).toBeNull();
  });
});

describe('time words', () => {
  it('says ages as people do (durations: the shared table above)', () => {
    expect(ago(null)).toBe('');
    expect(ago(1000, 1008)).toBe('8s ago');
    expect(ago(1000, 1000 + 5 * 60)).toBe('5m ago');
  });
});

describe('speedText', () => {
  it('gives step time, throughput and GPU memory in short units', () => {
    const text = speedText(job({ step_time_s: 0.21, samples_per_s: 1520, gpu_mem_peak_bytes: 31.2 * 2 ** 30, gpu_util_percent: 87.4 }));
    expect(text).toBe('0.21 s/step · 1.52k samples/s · GPU peak 31.2 GiB · 87% busy');
    expect(speedText(job({}))).toBe('');
  });
});

describe('cellsRow', () => {
  it('keeps each value on one line and puts the breaks between them', () => {
    const row = cellsRow('ne-sub', ['ran 1m 44s', 'ended 3m ago']);
    expect([...row.querySelectorAll('.ne-cell')].map(c => c.textContent)).toEqual(['ran 1m 44s', 'ended 3m ago']);
    expect(row.textContent).toBe('ran 1m 44s · ended 3m ago');
  });
});

describe('trackingRow', () => {
  it('links only http(s) pages, and shows a command otherwise', () => {
    const row = trackingRow([
      { tracker: 'mlflow', label: 'MLflow run 3f2a', url: 'https://mlflow.example/r/3f2a', command: null, path: null },
      { tracker: 'evil', label: 'click me', url: 'javascript:alert(1)', command: null, path: null },
      { tracker: 'tensorboard', label: 'TensorBoard', url: null, command: 'tensorboard --logdir /j/toy', path: '/j/toy' }
    ]);
    expect(row?.querySelectorAll('a').length).toBe(1);
    expect(row?.querySelector('a')?.getAttribute('href')).toBe('https://mlflow.example/r/3f2a');
    expect(row?.querySelector('a')?.getAttribute('rel')).toBe('noopener noreferrer');
    expect(row?.querySelector('.ne-tracking-command')?.textContent).toBe('tensorboard --logdir /j/toy');
    // One line (CSS: nowrap, an ellipsis): no break opportunity inside the command.
    expect(row?.querySelectorAll('.ne-tracking-command wbr').length).toBe(0);
    expect(row?.querySelector('.ne-tracking-item')?.getAttribute('title')).toBe('tensorboard --logdir /j/toy');
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
