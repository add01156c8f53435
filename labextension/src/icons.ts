/**
 * The extension's icon: one block fanning out to replicas (cell toolbar, palette, menus).
 */

import { LabIcon } from '@jupyterlab/ui-components';

const SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <rect x="9" y="2" width="6" height="6" rx="1"/>
    <rect x="2" y="16" width="6" height="6" rx="1"/>
    <rect x="9" y="16" width="6" height="6" rx="1"/>
    <rect x="16" y="16" width="6" height="6" rx="1"/>
    <path d="M11 8h2v3h6a1 1 0 0 1 1 1v4h-2v-3h-5v3h-2v-3H6v3H4v-4a1 1 0 0 1 1-1h6z"/>
  </g>
</svg>`;

export const distributeIcon = new LabIcon({
  name: 'nbdist:distribute',
  svgstr: SVG
});
