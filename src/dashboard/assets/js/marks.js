// What the browser test reads (tests/browser/dashboard.mjs): `window.augur.marks` holds the
// time (ms since navigation start) each part of a page was first drawn; `updates` counts the
// live updates applied and `lastUpdate` names the trials of the latest; `terminal` holds the
// size of the trial page's terminal (`terminal.js`) as last sent to the server.

window.augur = { marks: {}, updates: 0 };

/** Records the first time `name` is reached. */
export function mark(name) {
  if (!(name in window.augur.marks)) window.augur.marks[name] = performance.now();
}

/** Records a live update that brought the given trials. */
export function noteLiveUpdate(trialIds) {
  window.augur.updates += 1;
  window.augur.lastUpdate = { trials: trialIds, at: performance.now() };
}
