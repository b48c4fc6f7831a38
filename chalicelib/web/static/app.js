// The dashboard's shell: sign-in, navigation and a hash router. Each page is
// a module whose mount(main, params) returns a function that stops it.
import { api, token, whenUnauthenticated, ApiError } from './api.js';
import { h, problemText } from './dom.js';
import * as jobs from './jobs.js';

const main = document.getElementById('main');
const signout = document.getElementById('signout');
let unmount = null;
let afterLogin = '#/jobs';
let signingIn = false; // a 401 then is the form's to report

const ROUTES = [
  [/^#\/jobs\/([^/?]+)\/ranks$/, () => import('./ranks.js'), 'jobs'],
  [/^#\/jobs\/([^/?]+)$/, () => import('./job.js'), 'jobs'],
  [/^#\/nodes$/, () => import('./nodes.js'), 'nodes'],
  [/^#\/usage(?:\?.*)?$/, () => import('./usage.js'), 'usage'],
  [/^#\/jobs(?:\?.*)?$/, async () => jobs, 'jobs'],
];

async function route() {
  const hash = location.hash || '#/jobs';
  if (unmount) { unmount(); unmount = null; }
  signout.hidden = !token.get();
  if (!token.get()) {
    if (hash !== '#/login') afterLogin = hash;
    return showLogin();
  }
  if (hash === '#/login') { location.hash = '#/jobs'; return; }
  for (const [re, load, nav] of ROUTES) {
    const m = hash.match(re);
    if (!m) continue;
    for (const a of document.querySelectorAll('[data-nav]')) {
      if (a.dataset.nav === nav) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
    const page = await load();
    main.replaceChildren();
    unmount = page.mount(main, m.slice(1).map(decodeURIComponent), hash) || null;
    return;
  }
  main.replaceChildren(h('h1', { text: 'Not found' }),
    h('p', {}, 'No page at ', h('code', { text: hash }), '. ', h('a', { href: '#/jobs', text: 'Back to the jobs' })));
}

function showLogin(message) {
  document.title = 'Sign in · gpujobs';
  const input = h('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false' });
  const status = h('p', { id: 'login-status', class: 'error', role: 'alert', text: message || '' });
  const form = h('form', { class: 'login', onsubmit: async (e) => {
    e.preventDefault();
    const t = input.value.trim();
    if (!t) return;
    token.set(t);
    signingIn = true;
    try {
      await api.listJobs({ pageSize: 1 });
    } catch (err) {
      token.clear();
      status.textContent = err instanceof ApiError && err.status === 401
        ? 'That token is not recognised.' : `Could not sign in: ${problemText(err)}`;
      input.focus();
      return;
    } finally {
      signingIn = false;
    }
    const target = afterLogin === '#/login' ? '#/jobs' : afterLogin;
    if (location.hash === target) route(); // no hashchange will come
    else location.hash = target;
  } },
  h('h1', { text: 'Sign in' }),
  h('p', { class: 'muted', text: 'Paste your tenant token. It is kept in this tab only (sessionStorage) and sent as a bearer token to the API.' }),
  h('label', { for: 'token', text: 'API token' }), input,
  h('button', { type: 'submit', class: 'primary', text: 'Sign in' }), status);
  main.replaceChildren(form);
  input.focus();
}

whenUnauthenticated(() => {
  if (signingIn) return;
  token.clear();
  if (unmount) { unmount(); unmount = null; }
  signout.hidden = true;
  showLogin('Your token was refused (401); sign in again.');
});
signout.addEventListener('click', () => { token.clear(); location.hash = '#/login'; route(); });
window.addEventListener('hashchange', route);
route();
