/**
 * nbdist's JupyterLab extension: wiring only. The features live in their own modules:
 * `comm` (kernel state over the "nbdist" comm), `distribute` (the Distribute-cell command),
 * `statusitem` (the status bar item), `settings`, `magicline` and `state` (pure logic),
 * `plotlyloader` (plotly.js for the live dashboard's figure, once per page), `staleoutputs`
 * (a dashboard saved while its run went on, opened when that kernel no longer has it),
 * `recover` (the live dashboard on a page loaded while its run goes on).
 */

import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, showErrorMessage } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Signal } from '@lumino/signaling';

import { NbdistStateTracker } from './comm';
import { COMMAND_ID, distributeActiveCell } from './distribute';
import { distributeIcon } from './icons';
import { installPlotlyLoader } from './plotlyloader';
import { followLiveRuns } from './recover';
import { NbdistSettings } from './settings';
import { repairStaleDashboards } from './staleoutputs';
import { NbdistStatusItem, showStatusDialog } from './statusitem';

const PLUGIN_ID = 'nbdist:plugin';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'nbdist: a Distribute-cell command and a status bar item for distributed TensorFlow.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, IStatusBar, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    palette: ICommandPalette | null,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null
  ) => {
    const settings = new NbdistSettings();
    if (settingRegistry) {
      settings
        .load(settingRegistry, PLUGIN_ID)
        .catch(err => console.error('nbdist: could not load settings', err));
    }

    const tracker = new NbdistStateTracker(notebooks);
    notebooks.widgetAdded.connect((_, panel) => {
      const state = () => tracker.channelFor(panel.sessionContext)?.state ?? null;
      repairStaleDashboards(panel, state).catch(err =>
        console.warn('nbdist: could not check the saved dashboards', err)
      );
      followLiveRuns(panel, () => tracker.channelFor(panel.sessionContext));
    });

    app.commands.addCommand(COMMAND_ID, {
      label: 'Distribute Cell',
      caption:
        "Add or update the active cell's %%distribute line with the kernel's strategy " +
        '(or open the strategy picker when none is set)',
      icon: distributeIcon,
      isEnabled: () => notebooks.activeCell !== null,
      execute: async () => {
        const panel = notebooks.currentWidget;
        if (!panel) {
          return;
        }
        const state = tracker.channelFor(panel.sessionContext)?.state ?? null;
        try {
          return await distributeActiveCell(panel, state, settings.defaultStrategyLine);
        } catch (err) {
          void showErrorMessage('Distribute cell', (err as Error).message);
        }
      }
    });
    const refresh = () => app.commands.notifyCommandChanged(COMMAND_ID);
    notebooks.activeCellChanged.connect(refresh);
    notebooks.currentChanged.connect(refresh);
    palette?.addItem({ command: COMMAND_ID, category: 'nbdist' });

    if (statusBar) {
      const item = new NbdistStatusItem(() => void showStatusDialog(tracker.current));
      const activeChanged = new Signal<NbdistStatusItem, void>(item);
      tracker.changed.connect((_, state) => {
        item.showState(state);
        activeChanged.emit();
      });
      settings.changed.connect(() => activeChanged.emit());
      statusBar.registerStatusItem(`${PLUGIN_ID}-status`, {
        item,
        align: 'left',
        rank: 4,
        isActive: () => settings.showStatusItem && tracker.state !== null,
        activeStateChanged: activeChanged
      });
      item.showState(tracker.state);
    }
  }
};

/** No requirements: it activates wherever notebooks render (JupyterLab 4, Notebook 7). */
const plotlyPlugin: JupyterFrontEndPlugin<void> = {
  id: 'nbdist:plotly',
  description: "plotly.js for nbdist's live dashboard figure, loaded once per page.",
  autoStart: true,
  activate: () =>
    installPlotlyLoader(globalThis as any, () => import('plotly.js-dist-min'))
};

export default [plugin, plotlyPlugin];
