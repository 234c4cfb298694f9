/**
 * Dashboards whose kernel is gone (#11 item 7).
 *
 * The dashboard itself is plain ipywidgets; two things only a front end can do live here:
 * - its "follow again" button (`.ne-attach`, shown by the dashboard's own CSS once ipywidgets
 *   marks the view disconnected) runs `%elastic_attach NAME` in a new cell below, enabled
 *   only while the notebook's kernel is idle;
 * - a dashboard output whose widget model is gone ("Error displaying widget: model not
 *   found": the kernel restarted and the widget state was not saved) shows the text/html
 *   twin the dashboard put in the same mime bundle: its last picture, with the word;
 * - a dashboard whose kernel went while its job ran (restarted, died) hands its last picture
 *   (a hidden `<template class="ne-twin-html">` the dashboard keeps current) to that twin, so a
 *   notebook saved afterwards shows the picture from when the kernel went, not the first one.
 * Notebooks come from JupyterLab's notebook tracker, typed (NotebookPanel, its cells' models).
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Cell, ICodeCellModel } from '@jupyterlab/cells';
import * as nbformat from '@jupyterlab/nbformat';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IOutputAreaModel } from '@jupyterlab/outputarea';

const MODEL_NOT_FOUND = 'Error displaying widget: model not found';

/** The cell (a widget of the notebook) that holds ``node``, its index, and its outputs (a code cell's). */
function cellOf(panel: NotebookPanel, node: Element): { cell: Cell; index: number; outputs: IOutputAreaModel | null } | null {
  const cells = panel.content.widgets;
  const index = cells.findIndex(c => c.node.contains(node));
  if (index < 0) {
    return null;
  }
  const cell = cells[index];
  const outputs = cell.model.type === 'code' ? (cell.model as ICodeCellModel).outputs : null;
  return { cell, index, outputs };
}

/** The code a "follow again" button runs: the magic needs the extension loaded first. */
export function attachCode(command: string): string {
  return `%load_ext notebook_elastic\n${command}`;
}

async function follow(app: JupyterFrontEnd, panel: NotebookPanel, button: HTMLButtonElement): Promise<void> {
  const where = cellOf(panel, button);
  const command = button.dataset.command;
  if (!where || !command) {
    return;
  }
  button.disabled = true;
  panel.content.activeCellIndex = where.index;
  await app.commands.execute('notebook:insert-cell-below');
  const added = panel.content.activeCell;
  if (!added) {
    return;
  }
  added.model.sharedModel.setSource(attachCode(command));
  await app.commands.execute('notebook:run-cell');
}

/** Show the text/html twin where the widget model is gone. */
function fallBack(panel: NotebookPanel): void {
  for (const node of Array.from(panel.node.querySelectorAll<HTMLElement>('.jp-OutputArea-output.jupyter-widgets'))) {
    if (node.dataset.neFallback || node.textContent !== MODEL_NOT_FOUND) {
      continue;
    }
    const child = node.closest('.jp-OutputArea-child');
    const where = child ? cellOf(panel, child) : null;
    if (!child || !child.parentElement || !where || !where.outputs) {
      continue;
    }
    const index = Array.from(child.parentElement.children).indexOf(child);
    const output = index < where.outputs.length ? where.outputs.get(index) : undefined;
    const html = output?.data['text/html'];
    if (!output || typeof html !== 'string' || !html.includes('ne-snapshot')) {
      continue;
    }
    node.dataset.neFallback = '1';
    const renderer = panel.content.rendermime.createRenderer('text/html');
    void renderer.renderModel(output).then(() => {
      node.textContent = '';
      node.classList.remove('jupyter-widgets');
      node.appendChild(renderer.node);
      refreshButtons(panel);
    });
  }
}

/** Copy each disconnected dashboard's last picture into its output's text/html twin. */
function keepLastPicture(panel: NotebookPanel): void {
  const selector = '.notebook-elastic-dashboard.jupyter-widgets-disconnected template.ne-twin-html';
  for (const template of Array.from(panel.node.querySelectorAll<HTMLTemplateElement>(selector))) {
    const html = template.innerHTML;
    const child = template.closest('.jp-OutputArea-child');
    const where = child ? cellOf(panel, child) : null;
    if (!html.includes('ne-snapshot') || !child || !child.parentElement || !where || !where.outputs) {
      continue;
    }
    const outputs = where.outputs;
    const index = Array.from(child.parentElement.children).indexOf(child);
    const output = index < outputs.length ? outputs.get(index) : undefined;
    if (!output || output.data['text/html'] === undefined || output.data['text/html'] === html) {
      continue;
    }
    const json = output.toJSON();
    const data = { ...((json.data as nbformat.IMimeBundle | undefined) ?? {}), 'text/html': html };
    outputs.set(index, { ...json, data } as nbformat.IOutput);
  }
}

function refreshButtons(panel: NotebookPanel): void {
  const ctx = panel.sessionContext;
  const ready = !!(ctx.session && ctx.session.kernel) && ctx.kernelDisplayStatus === 'idle';
  for (const button of Array.from(panel.node.querySelectorAll<HTMLButtonElement>('button.ne-attach'))) {
    button.disabled = !ready;
  }
}

export function watchDashboards(app: JupyterFrontEnd, notebooks: INotebookTracker): void {
  const seen = new WeakSet<NotebookPanel>();
  const hook = (w: NotebookPanel) => {
    if (seen.has(w)) {
      return;
    }
    seen.add(w);
    let pending = 0;
    const check = () => {
      pending = 0;
      keepLastPicture(w);
      fallBack(w);
      refreshButtons(w);
    };
    // Outputs change often (a live dashboard re-renders a few times a second): look at
    // most every 300 ms, and only at the few nodes that matter.
    const observer = new MutationObserver(() => {
      if (!pending) {
        pending = window.setTimeout(check, 300);
      }
    });
    observer.observe(w.node, { childList: true, subtree: true, characterData: true });
    w.sessionContext.statusChanged.connect(check);
    w.node.addEventListener('click', event => {
      const button = (event.target as HTMLElement).closest('button.ne-attach') as HTMLButtonElement | null;
      if (button && !button.disabled) {
        event.preventDefault();
        void follow(app, w, button);
      }
    });
    w.disposed.connect(() => observer.disconnect());
    check();
  };
  notebooks.widgetAdded.connect((_tracker, panel) => hook(panel));
  notebooks.forEach(hook);
}
