// Building DOM nodes and showing values: the helpers every page draws with. Text always goes
// in as text nodes, never as HTML.

/** The first element matching a CSS selector. */
export const $ = (selector, root = document) => root.querySelector(selector);

/**
 * An element: `h('a', { href, class, onclick }, ...children)`. Attributes named `on…` become
 * listeners; `null`, `undefined` and `false` attributes and children are left out; other
 * children are appended as nodes or as text.
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value == null || value === false) continue;
    if (name.startsWith('on')) el.addEventListener(name.slice(2), value);
    else if (name === 'class') el.className = value;
    else el.setAttribute(name, value === true ? '' : value);
  }
  for (const child of children.flat()) {
    if (child == null) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** A value for display: integers as they are, other numbers with 6 significant digits. */
export function fmt(value) {
  if (value == null || value === '') return '';
  if (typeof value !== 'number') return String(value);
  if (Number.isInteger(value)) return String(value);
  const magnitude = Math.abs(value);
  return magnitude !== 0 && (magnitude < 1e-3 || magnitude >= 1e6)
    ? value.toExponential(4)
    : String(Number(value.toPrecision(6)));
}

/** A study's or trial's state as a coloured badge. */
export const stateBadge = (state) => h('span', { class: 'state ' + state }, state);

/** A table of `[label, value]` rows. */
export const keyValueTable = (pairs) => h('table', { class: 'plain' },
  h('tbody', {}, pairs.map(([label, value]) => h('tr', {}, h('th', {}, label), h('td', {}, value)))));

/** A failure shown above the page's content. */
export function showError(error) {
  $('#main').prepend(h('p', { class: 'error' }, String(error.message || error)));
}

/** Resolves on a later task, so the browser can paint and handle input in between. */
export const nextTask = () => new Promise((resolve) => setTimeout(resolve, 0));
