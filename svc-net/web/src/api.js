// The Proxy Service's web API (docs/web-ui.md, "Web API"): cookie-authenticated JSON, with the
// session's CSRF token on every state-changing request.

/** An error answer of the web API: `status` and the server's own message. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
  }
}

let csrfToken = null;
let onUnauthorized = () => {};

/** Called whenever the server says the session is missing or over (401). */
export function setUnauthorizedHandler(fn) {
  onUnauthorized = fn;
}

async function errorOf(resp) {
  let message = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    if (body && body.error && typeof body.error.message === 'string') {
      message = body.error.message;
    }
  } catch {
    // Not JSON: keep the status line.
  }
  return new ApiError(resp.status, message);
}

/**
 * One request to the web API. `body` is sent as JSON. Returns the parsed JSON answer, throws
 * ApiError with the server's message otherwise.
 */
export async function request(method, path, body, { signIn = false } = {}) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method !== 'GET' && method !== 'HEAD' && !signIn && csrfToken) {
    headers['X-CSRF-Token'] = csrfToken;
  }
  let resp;
  try {
    resp = await fetch(path, {
      method,
      headers,
      credentials: 'same-origin',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    throw new ApiError(0, `cannot reach the Proxy Service: ${e.message}`);
  }
  if (!resp.ok) {
    const err = await errorOf(resp);
    if (resp.status === 401 && !signIn) onUnauthorized(err);
    throw err;
  }
  const text = await resp.text();
  return text ? JSON.parse(text) : {};
}

/** The current web session, or null when there is none. */
export async function currentSession() {
  try {
    const s = await request('GET', '/webapi/sessions/web', undefined, { signIn: true });
    csrfToken = s.csrf_token;
    return s;
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return null;
    throw e;
  }
}

/** Signs in with a password; the server sets the session cookie. */
export async function signIn(user, pass) {
  const s = await request('POST', '/webapi/sessions/web', { user, pass }, { signIn: true });
  csrfToken = s.csrf_token;
  return s;
}

/** Ends the session on the server. */
export async function signOut() {
  try {
    await request('DELETE', '/webapi/sessions/web');
  } finally {
    csrfToken = null;
  }
}

/** Builds a query string from the non-empty entries of `params`. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && String(v).trim() !== '') q.set(k, String(v).trim());
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}
