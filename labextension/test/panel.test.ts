/**
 * The panel's polling (src/panel.ts, Lumino's Poll): every 2 s while a job lives, every 10 s
 * when none does, less and less often while the server does not answer, never after disposal.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import type { IJobsReply } from '../src/contract';
import { reply as listing, row } from './rows';

const listJobs = vi.fn<() => Promise<IJobsReply>>();
vi.mock('../src/request', () => ({ listJobs: () => listJobs(), stopJob: vi.fn() }));
// The stop dialogs are not exercised here (the browser tests click them); apputils needs a browser's DragEvent.
vi.mock('@jupyterlab/apputils', () => ({ Dialog: {}, showDialog: vi.fn() }));

const { JobsPanel } = await import('../src/panel');

function reply(statuses: string[]): IJobsReply {
  return listing(statuses.map((status, i) => row({ name: `job-${i}`, status })));
}

/** Advance the clock by ``ms`` and let the poll's promises settle. */
async function advance(ms: number): Promise<void> {
  await vi.advanceTimersByTimeAsync(ms);
}

describe('JobsPanel polling', () => {
  beforeEach(() => {
    vi.useFakeTimers();
    listJobs.mockReset();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('asks every 2 s while a job lives and every 10 s when none does', async () => {
    listJobs.mockResolvedValue(reply(['running']));
    const panel = new JobsPanel(() => undefined);
    await advance(10);
    expect(listJobs).toHaveBeenCalledTimes(1);
    await advance(2000);
    expect(listJobs).toHaveBeenCalledTimes(2);
    expect(panel.node.querySelector('.ne-job')?.getAttribute('data-status')).toBe('running');
    listJobs.mockResolvedValue(reply(['succeeded']));
    await advance(2000); // this answer says nothing lives any more
    expect(listJobs).toHaveBeenCalledTimes(3);
    await advance(9000);
    expect(listJobs).toHaveBeenCalledTimes(3);
    await advance(1100);
    expect(listJobs).toHaveBeenCalledTimes(4);
    panel.dispose();
    await advance(60000);
    expect(listJobs).toHaveBeenCalledTimes(4);
  });

  it('backs off while the server does not answer, says so, and tells the status bar', async () => {
    listJobs.mockRejectedValue(new Error('404'));
    const panel = new JobsPanel(() => undefined);
    const failures: (string | null)[] = [];
    panel.refreshed.connect((_p, { failure }) => failures.push(failure));
    await advance(10);
    await advance(20000);
    const calls = listJobs.mock.calls.length;
    expect(calls).toBeGreaterThan(1);
    expect(calls).toBeLessThan(10); // at a steady 2 s it would be 11
    expect(failures.every(f => f?.startsWith('The notebook-elastic server extension does not answer: 404'))).toBe(true);
    expect(panel.node.querySelector('.ne-banner')?.textContent).toContain('jupyter server extension list');
    panel.dispose();
  });
});
