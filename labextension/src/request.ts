/**
 * The one place that talks to the server: the notebook-elastic REST routes. Each reply is the
 * interface contract.ts generates from the server's class of it (server/rows.py).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { IErrorReply, IEventsReply, IJobRow, IJobsReply, IStopReply } from './contract';

/** What a route answers when it answers (a 2xx). */
export type IReply = IJobsReply | IEventsReply | IStopReply;

/** A refusal's body as our routes write it (a proxy's or a dead server's may be anything). */
function isErrorReply(data: unknown): data is IErrorReply {
  return typeof data === 'object' && data !== null && typeof (data as Partial<IErrorReply>).message === 'string';
}

export async function requestAPI<T extends IReply>(endPoint: string, init: RequestInit = {}): Promise<T> {
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
    const message = (isErrorReply(data) && data.message) || (typeof data === 'string' && data) || response.statusText;
    throw new ServerConnection.ResponseError(response, message);
  }
  // The one unchecked step: the server built this reply as its class (mypy checks routes.py,
  // each row is checked against JobRow before it is sent; test_server.py validates every reply
  // against the generated schema), and contract.ts is generated from the same class.
  return data as T;
}

export function listJobs(): Promise<IJobsReply> {
  return requestAPI<IJobsReply>('jobs');
}

export function stopJob(job: IJobRow): Promise<IStopReply> {
  return requestAPI<IStopReply>(`jobs/${encodeURIComponent(job.name)}/stop`, {
    method: 'POST',
    body: JSON.stringify({ backend: job.backend })
  });
}
