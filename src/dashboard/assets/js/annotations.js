// Notes, tags and user attributes of a study or a trial: an editor for the note and tags
// (saved with PATCH; the server says who may), and the user attributes training code set.

import { apiPatch } from './api.js';
import { fmt, h, keyValueTable } from './dom.js';

/** Tags as typed: comma-separated, trimmed, empty ones dropped (the server keeps each once). */
export const parseTags = (text) => text.split(',').map((t) => t.trim()).filter((t) => t);

/**
 * The note and tags of the study or trial at `path` (its API URL), editable. `annotated` is
 * the study or trial as the API gave it; `idPrefix` names the inputs (`study`, `trial`).
 */
export function annotationEditor(path, annotated, idPrefix) {
  const note = h('textarea', { id: `${idPrefix}-note`, rows: 3, placeholder: 'a note: what this was for, what you learned' });
  note.value = annotated.note || '';
  const tags = h('input', { id: `${idPrefix}-tags`, placeholder: 'tags, comma-separated' });
  tags.value = (annotated.tags || []).join(', ');
  const status = h('span', { class: 'muted', id: `${idPrefix}-annotation-status` });
  const save = h('button', {
    id: `${idPrefix}-save-annotations`, class: 'secondary',
    onclick: async () => {
      status.textContent = 'saving…';
      try {
        const saved = await apiPatch(path, { note: note.value, tags: parseTags(tags.value) });
        tags.value = (saved.tags || []).join(', ');
        status.textContent = 'saved';
      } catch (e) {
        status.textContent = String(e.message || e);
      }
    },
  }, 'Save');
  return h('div', { class: 'annotations' }, note, h('div', { class: 'bar' }, tags, save, status));
}

/** User attributes as a table (values that are not text or numbers as JSON). */
export function userAttrsTable(attrs) {
  const entries = Object.entries(attrs || {});
  if (!entries.length) return h('p', { class: 'muted' }, 'None set. Training code sets them with PATCH …/trials/{trial} {"user_attrs": {…}} (Python: trial.set_user_attr).');
  return keyValueTable(entries.map(([k, v]) => [k, attrText(v)]));
}

/** A user attribute's value for display. */
export const attrText = (v) => (v != null && typeof v === 'object' ? JSON.stringify(v) : fmt(v));
