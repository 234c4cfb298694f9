/**
 * Rows as the server sends them: every field of contract.ts's IJobRow (generated from
 * server/rows.py's JobRow), so a test's row is one the panel can really be given.
 */
import type { IJobRow, IJobsReply } from '../src/contract';

/** A running local job's row with nothing measured yet, and what the test sets. */
export function row(overrides: Partial<IJobRow> = {}): IJobRow {
  return {
    name: 'toy',
    backend: 'local',
    status: 'running',
    damaged: null,
    reason: null,
    waiting: null,
    stall: null,
    warning: null,
    world_size: null,
    nodes_running: null,
    target: null,
    min_nodes: null,
    max_nodes: null,
    restarts: null,
    max_restarts: null,
    step: null,
    total_steps: null,
    loss: null,
    loss_tail: [],
    step_time_s: null,
    samples_per_s: null,
    tokens_per_s: null,
    gpu_mem_peak_bytes: null,
    gpu_util_percent: null,
    tracking: [],
    transitions: [],
    started_at: null,
    finished_at: null,
    notebook: null,
    location: null,
    ...overrides
  };
}

/** GET /jobs's reply listing these rows. */
export function reply(jobs: IJobRow[]): IJobsReply {
  return { jobs, errors: {}, server_ms: 1 };
}
