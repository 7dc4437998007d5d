// Live updates without reloading every trial: follow a study's change cursor
// (`GET /v1/studies/{study}/changes?after=<cursor>`) and hand over only what changed.

import { api } from './api.js';

const POLL_MS = 400;
/** Pages of 1,000 changes read per round at most, so one round stays bounded. */
const MAX_PAGES_PER_ROUND = 50;

/**
 * Polls the study's changes from `cursor` on, forever. Each round awaits
 * `onChanges(trials)` when trials changed, then `onRound()`. A failed request (the server
 * may be restarting) is tried again the next round.
 */
export async function followChanges({ study, cursor, onChanges, onRound }) {
  for (;;) {
    let changed = [];
    try {
      for (let page = 0; page < MAX_PAGES_PER_ROUND; page++) {
        const r = await api(`/v1/studies/${study}/changes?after=${encodeURIComponent(cursor)}&page_size=1000`);
        cursor = r.cursor;
        changed = changed.concat(r.trials);
        if (!r.has_more) break;
      }
    } catch (e) { /* try again next round */ }
    if (changed.length) await onChanges(changed);
    onRound();
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}
