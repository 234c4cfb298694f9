/**
 * The one place that talks to the server: the notebook-elastic REST routes.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** A change of a job's status, with its time (epoch seconds) and the event that caused it. */
export interface ITransition {
  status: string;
  at: number;
  cause: string;
  /** For a restart: its cause first, then what else happened while it lasted. */
  events?: string[];
}

/** Where a job's run is tracked (server/routes.py, runtime/tracking.py `shown`): credentials stripped. */
export interface ITracking {
  tracker: string;
  label: string;
  /** The run's page (http(s) only), or null where there is none (a store on disk, W&B offline). */
  url: string | null;
  /** The command that shows it: mlflow ui ..., wandb sync ..., tensorboard --logdir ... */
  command: string | null;
  path: string | null;
}

export interface IJob {
  name: string;
  backend: string;
  status: string;
  damaged: string | null;
  reason: string | null;
  /** Why capacity the job asked for is not coming (a worker pod over quota, say). */
  waiting: string | null;
  /** A stall in progress, in words ("stalled at step 120 for 31 s: rank(s) 1 stopped, ..."). */
  stall: string | null;
  /** A condition the job trains on through (a full checkpoint disk). */
  warning: string | null;
  world_size: number | null;
  nodes_running: number | null;
  target: number | null;
  min_nodes: number | null;
  max_nodes: number | null;
  restarts: number | null;
  max_restarts: number | null;
  /** Steps done (the last step reported + 1), as every view counts them: 100 of a 100-step job. */
  step: number | null;
  total_steps: number | null;
  loss: number | null;
  loss_tail: number[];
  step_time_s?: number | null;
  samples_per_s?: number | null;
  tokens_per_s?: number | null;
  gpu_mem_peak_bytes?: number | null;
  gpu_util_percent?: number | null;
  transitions: ITransition[];
  tracking?: ITracking[];
  started_at: number | null;
  finished_at: number | null;
  notebook: string | null;
}

export interface IJobsReply {
  jobs: IJob[];
  errors: { [backend: string]: string };
  server_ms: number;
}

export async function requestAPI<T>(endPoint: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'notebook-elastic', 'api', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: unknown = text;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      // not JSON: keep the text (an HTML error page, say)
    }
  }
  if (!response.ok) {
    const said = typeof data === 'object' && data !== null ? (data as { message?: unknown }).message : undefined;
    const message = (typeof said === 'string' && said) || (typeof data === 'string' && data) || response.statusText;
    throw new ServerConnection.ResponseError(response, message);
  }
  return data as T;
}

export function listJobs(): Promise<IJobsReply> {
  return requestAPI<IJobsReply>('jobs');
}

export function stopJob(job: IJob): Promise<{ name: string; status: string }> {
  return requestAPI(`jobs/${encodeURIComponent(job.name)}/stop`, {
    method: 'POST',
    body: JSON.stringify({ backend: job.backend })
  });
}
