import { signIn } from '../api.js';
import { h, notice, replace } from '../dom.js';

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
  );
  replace(main, form);
  user.focus();
}
