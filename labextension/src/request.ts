/**
 * The one place that talks to the server: the notebook-elastic REST routes.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { IJobRow } from './contract';

export type { ITracking, ITransition } from './contract';

/** A row of GET /jobs: generated from the server's JobRow (server/rows.py) into contract.ts. */
export type IJob = IJobRow;

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
