/**
 * notebook-elastic for JupyterLab: the "Elastic jobs" side panel, a status bar item and two
 * commands, over the server extension's routes (see request.ts); and the word and the
 * "follow again" button of dashboards whose kernel is gone (see dashboards.ts).
 */
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { watchDashboards } from './dashboards';
import { statusText } from './format';
import { JobsPanel } from './panel';

const ICON = new LabIcon({
  name: 'notebook-elastic:jobs',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><path class="jp-icon3" fill="#616161" d="M3 17h2v4H3zm4-5h2v9H7zm4 3h2v6h-2zm4-8h2v14h-2zm4 4h2v10h-2zM3 13l5-5 4 3 8-8 1 1-9 9-4-3-4 4z"/></svg>'
});

export const COMMANDS = {
  show: 'notebook-elastic:show-panel',
  stopAll: 'notebook-elastic:stop-all'
};

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'notebook-elastic:plugin',
  description: 'Elastic jobs panel and status bar item',
  autoStart: true,
  requires: [ILabShell, INotebookTracker],
  optional: [ICommandPalette, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    notebooks: INotebookTracker,
    palette: ICommandPalette | null,
    statusBar: IStatusBar | null
  ) => {
    const panel = new JobsPanel(path => void app.commands.execute('docmanager:open', { path }));
    panel.title.icon = ICON;
    shell.add(panel, 'left', { rank: 900 });
    watchDashboards(app, notebooks);

    app.commands.addCommand(COMMANDS.show, {
      label: 'Elastic jobs: show panel',
      execute: () => shell.activateById(panel.id)
    });
    app.commands.addCommand(COMMANDS.stopAll, {
      label: 'Elastic jobs: stop all',
      execute: () => panel.stopAll()
    });
    if (palette) {
      palette.addItem({ command: COMMANDS.show, category: 'Elastic jobs' });
      palette.addItem({ command: COMMANDS.stopAll, category: 'Elastic jobs' });
    }
    if (statusBar) {
      const item = new Widget();
      item.addClass('ne-statusbar');
      item.node.title = 'Elastic jobs: show panel';
      item.node.addEventListener('click', () => shell.activateById(panel.id));
      panel.refreshed.connect((_panel, { jobs, failure }) => {
        item.node.textContent = failure ? 'elastic jobs: server extension missing' : statusText(jobs);
      });
      statusBar.registerStatusItem('notebook-elastic:status', {
        item,
        align: 'left',
        rank: 50,
        isActive: () => true
      });
    }
  }
};

export default plugin;
