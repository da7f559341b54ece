import { request, signIn } from '../api.js';
import { h, notice, replace } from '../dom.js';

/**
 * The cluster's single sign-on connectors as the ping lists them (`auth.connectors`): a link
 * per connector to the proxy's `/webapi/sso/web/begin`, which sends the browser to the
 * provider and comes back signed in. Nothing when the cluster has none.
 */
async function ssoLinks(slot) {
  let ping;
  try {
    ping = await request('GET', '/webapi/ping');
  } catch {
    return;
  }
  const connectors = (ping && ping.auth && Array.isArray(ping.auth.connectors) && ping.auth.connectors) || [];
  if (connectors.length === 0) return;
  const links = connectors.map((c) => {
    const query = new URLSearchParams({ kind: c.kind, connector_id: c.name });
    return h(
      'li',
      {},
      h('a', { class: 'button sso', href: `/webapi/sso/web/begin?${query}` }, `Sign in with ${c.display || c.name}`),
    );
  });
  replace(slot, h('p', {}, 'Or sign in through your identity provider:'), h('ul', { class: 'sso-list' }, links));
}

/** The sign-in page: user name and password (the Auth Service's lockout applies). */
export function loginPage(main, { onSignedIn, message }) {
  const status = h('div', { class: 'notice-slot', 'aria-live': 'polite' });
  if (message) status.appendChild(notice('info', message));
  const user = h('input', { id: 'login-user', name: 'user', autocomplete: 'username', required: true });
  const pass = h('input', {
    id: 'login-pass',
    name: 'pass',
    type: 'password',
    autocomplete: 'current-password',
    required: true,
  });
  const submit = h('button', { type: 'submit' }, 'Sign in');
  const sso = h('div', { class: 'sso-slot' });
  const form = h(
    'form',
    {
      class: 'card login',
      'aria-labelledby': 'login-title',
      onsubmit: async (e) => {
        e.preventDefault();
        submit.disabled = true;
        replace(status);
        try {
          const s = await signIn(user.value, pass.value);
          pass.value = '';
          onSignedIn(s);
        } catch (err) {
          replace(status, notice('error', `Sign-in failed: ${err.message}`));
          pass.focus();
        } finally {
          submit.disabled = false;
        }
      },
    },
    h('h1', { id: 'login-title' }, 'Sign in to svc'),
    status,
    h('label', { for: 'login-user' }, 'User name'),
    user,
    h('label', { for: 'login-pass' }, 'Password'),
    pass,
    submit,
    sso,
  );
  replace(main, form);
  ssoLinks(sso);
  user.focus();
}
