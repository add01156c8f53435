/**
 * The user's settings (schema/plugin.json), with defaults until the registry has loaded them.
 */

import type { ISettingRegistry } from '@jupyterlab/settingregistry';
import { ISignal, Signal } from '@lumino/signaling';

export class NbdistSettings {
  /** Strategy used instead of the picker when the kernel has none ("" = open the picker). */
  defaultStrategyLine = '';
  /** Whether the status bar item is shown. */
  showStatusItem = true;

  /** Emitted whenever the settings are (re)read. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Read the plugin's settings now and whenever the user changes them. */
  async load(registry: ISettingRegistry, pluginId: string): Promise<void> {
    const settings = await registry.load(pluginId);
    const read = () => {
      const c = settings.composite;
      this.defaultStrategyLine = String(c.defaultStrategyLine ?? '');
      this.showStatusItem = c.showStatusItem !== false;
      this._changed.emit();
    };
    read();
    settings.changed.connect(read);
  }

  private _changed = new Signal<this, void>(this);
}
