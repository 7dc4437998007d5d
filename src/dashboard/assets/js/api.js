// The JSON API (`/v1/...`) as the dashboard reads it: with the login cookie, sending the
// browser to the login form on 401, failing with the server's own error message.

/** GET `path` and decode its JSON; throws an Error carrying the server's message. */
export async function api(path) {
  const response = await fetch(path, { headers: { Accept: 'application/json' }, credentials: 'same-origin' });
  if (response.status === 401) {
    location.href = '/login?next=' + encodeURIComponent(location.pathname + location.search);
    throw new Error('sign in first');
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error((body.error && body.error.message) || response.statusText);
  return body;
}

/** GET `path` as plain text; null when the server has none to give. */
export async function apiText(path) {
  const response = await fetch(path, { credentials: 'same-origin' });
  return response.ok ? response.text() : null;
}

/** PATCH `path` with a JSON body; resolves to the answer's JSON, throws with the server's message. */
export async function apiPatch(path, body) {
  const response = await fetch(path, {
    method: 'PATCH', credentials: 'same-origin',
    headers: { Accept: 'application/json', 'Content-Type': 'application/json' },
    body: JSON.stringify(body),
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error((answer.error && answer.error.message) || response.statusText);
  return answer;
}
