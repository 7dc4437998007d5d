// plotly.js: loaded once, on demand, with the dashboard's shared layout and configuration;
// and labels handed to it as text.
//
// Plotly reads a subset of HTML in the strings it draws as rich text (titles, cartesian tick
// labels, legend and trace names, hover templates, parallel-coordinates axis labels):
// `<a href>` becomes a clickable link, `<b>` bold, `&lt;` a "<". Study names and categorical
// values are anyone's text (issue 10, finding 9), so every such label goes through
// `plotText`, which escapes `&`, `<` and `>`: Plotly then shows it literally, as typed.
// (Tick labels of parallel coordinates are plain SVG text already: they go in unescaped.)

import { h } from './dom.js';

let plotlyPromise = null;

/** plotly.js (4.6 MB), loaded after the first paint of numbers and tables, never blocking it. */
export function plotly() {
  if (!plotlyPromise) {
    plotlyPromise = new Promise((resolve, reject) => {
      const script = document.createElement('script');
      script.src = '/dashboard/plotly.min.js?v=' + document.body.dataset.version;
      script.onload = () => resolve(window.Plotly);
      script.onerror = () => reject(new Error('could not load plotly.js'));
      document.head.append(script);
    });
  }
  return plotlyPromise;
}

export const PLOT_CONFIG = { displaylogo: false, responsive: true };

/** The layout every chart starts from, with `extra` on top. */
export const baseLayout = (extra) => Object.assign({
  margin: { l: 56, r: 16, t: 8, b: 40 }, height: 320, hovermode: 'closest',
  paper_bgcolor: '#fff', plot_bgcolor: '#fff', showlegend: false,
}, extra);

const ENTITIES = { '&': '&amp;', '<': '&lt;', '>': '&gt;' };

/** A label as Plotly will show it literally: `&`, `<` and `>` escaped. */
export const plotText = (label) => String(label).replace(/[&<>]/g, (c) => ENTITIES[c]);

/** An axis (or colorbar) title. */
export const titled = (label) => ({ title: { text: plotText(label) } });

/** Tick positions and labels of a cartesian axis for categories drawn at 0, 1, 2, … */
export const categoryTicks = (categories) => ({
  tickvals: categories.map((_, i) => i),
  ticktext: categories.map(plotText),
});

/**
 * A "log scale" checkbox for the y axis of chart `chartId` (loss curves span decades). Charts
 * redrawn later keep the choice: their layouts take `yScale(chartId)`. Plotly leaves values
 * ≤ 0 out of a log axis.
 */
export function logScaleToggle(chartId) {
  const box = h('input', {
    type: 'checkbox', id: chartId + '-log',
    onchange: () => { if (window.Plotly) window.Plotly.relayout(chartId, { 'yaxis.type': yScale(chartId) }); },
  });
  return h('label', { class: 'toggle', title: 'values ≤ 0 are not drawn on a log axis' }, box, ' log scale');
}

/** The y axis type that `logScaleToggle(chartId)` asks for. */
export const yScale = (chartId) => (document.getElementById(chartId + '-log')?.checked ? 'log' : 'linear');
