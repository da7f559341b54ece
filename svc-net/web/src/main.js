// The svc Web UI: a single-page app under /web/ reading only the Proxy Service's web API.
import './style.css';
import { currentSession, setUnauthorizedHandler, signOut } from './api.js';
import { notice, replace } from './dom.js';
import { loginPage } from './pages/login.js';
import { resourcesPage } from './pages/resources.js';
import { inventoryPage } from './pages/inventory.js';
import { maintenancePage } from './pages/maintenance.js';
import { channelsPage } from './pages/channels.js';
import { terminalPage } from './pages/terminal.js';

const BASE = '/web';
const main = document.getElementById('main');
const top = document.getElementById('top');
const who = document.getElementById('who');

const routes = {
  '/resources': { title: 'Resources', page: resourcesPage },
  '/inventory': { title: 'Inventory', page: inventoryPage },
  '/maintenance': { title: 'Maintenance', page: maintenancePage },
  '/channels': { title: 'Version channels', page: channelsPage },
  '/terminal': { title: 'Terminal', page: terminalPage },
};

let session = null;
// Called when the page being left has something to close (the terminal's WebSocket).
let leave = null;
// A message for the next sign-in page (after signing out or when the session ended).
let flash = null;

/** Navigates inside the app (`path` under /web, e.g. `/inventory?upgrader=unit`). */
export function navigate(path, { replaceState = false } = {}) {
  const url = BASE + path;
  if (replaceState) history.replaceState(null, '', url);
  else history.pushState(null, '', url);
  render();
}

function currentPath() {
  let p = location.pathname;
  if (p.startsWith(BASE)) p = p.slice(BASE.length);
  if (p === '' || p === '/') p = '/resources';
  return p;
}

function showSignedIn(s) {
  session = s;
  top.hidden = false;
  who.textContent = `${s.user}`;
  who.title = `Roles: ${(s.roles || []).join(', ')}`;
}

function showSignedOut() {
  session = null;
  top.hidden = true;
  who.textContent = '';
}

async function render() {
  if (leave) {
    const l = leave;
    leave = null;
    try {
      l();
    } catch {
      // The page is going away anyway.
    }
  }
  const path = currentPath();
  for (const a of document.querySelectorAll('a[data-route]')) {
    if (new URL(a.href).pathname === BASE + path) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (!session || path === '/login') {
    if (path !== '/login') {
      const s = await currentSession().catch(() => null);
      if (s) {
        showSignedIn(s);
        return render();
      }
    }
    showSignedOut();
    document.title = 'Sign in · svc';
    const next = path === '/login' ? '/resources' : path + location.search;
    if (path !== '/login') history.replaceState(null, '', `${BASE}/login`);
    const message = flash;
    flash = null;
    return loginPage(main, {
      message,
      onSignedIn: (s) => {
        showSignedIn(s);
        navigate(next, { replaceState: true });
      },
    });
  }
  const route = routes[path];
  if (!route) {
    document.title = 'Not found · svc';
    replace(main, notice('error', `No page at ${location.pathname}.`));
    return;
  }
  document.title = `${route.title} · svc`;
  const params = new URLSearchParams(location.search);
  leave = (await route.page(main, { params, session, navigate })) || null;
  // Move focus to the new page for keyboard and screen-reader users (not on first load).
  if (document.activeElement === document.body || document.activeElement?.closest('nav')) {
    main.focus({ preventScroll: true });
  }
}

document.addEventListener('click', (e) => {
  const a = e.target.closest('a[data-route]');
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey) return;
  const url = new URL(a.href);
  if (url.origin !== location.origin || !url.pathname.startsWith(BASE)) return;
  e.preventDefault();
  navigate(url.pathname.slice(BASE.length) + url.search);
});

window.addEventListener('popstate', () => render());

document.getElementById('logout').addEventListener('click', async () => {
  try {
    await signOut();
  } catch {
    // Already over on the server: signed out either way.
  }
  showSignedOut();
  flash = 'You are signed out.';
  navigate('/login');
});

setUnauthorizedHandler(() => {
  if (!session) return;
  showSignedOut();
  flash = 'Your session has ended: sign in again.';
  navigate('/login');
});

render();
