// onceguard gateway page snippet (served at /onceguard/v1/snippet.js).
//
//   <script src="/onceguard/v1/snippet.js" defer></script>
//   <form method="post" action="/withdraw" data-onceguard="withdrawal"
//         data-onceguard-field="withdraw_token"> ... </form>
//
// One intent, one key: every form with data-onceguard="PURPOSE" gets a
// one-time submit token from the gateway (POST /onceguard/v1/submit-tokens)
// and sends it as its key: in the hidden input named by
// data-onceguard-field (the gateway's --key-field), or else as the
// Idempotency-Key header. The form is sent with fetch; its buttons are
// disabled from the first click until the answer and for a quiet moment
// after it, so a double click or a held Enter sends one request. A network
// error, 502 upstream_unavailable or a 503 keeps the same key and the same
// body for the retry (the gateway answers a retry of a request that got
// through from its record); 409 request_in_progress is asked again after
// Retry-After with the same key. An answer is handed to the page as the
// event "onceguard:answer" on the form (detail: status, code, replayed,
// text, contentType, url); unless a listener calls preventDefault(), an
// HTML answer replaces the page, and anything else is shown in the form's
// [data-onceguard-message] element.
'use strict';

(() => {
  const TOKENS = '/onceguard/v1/submit-tokens';
  const QUIET_MS = 700;
  const IN_PROGRESS_MAX = 60;

  function say(f, text) {
    const el = f.form.querySelector('[data-onceguard-message]');
    if (el) el.textContent = text;
  }

  function buttons(f, off) {
    for (const b of f.form.querySelectorAll('button, input[type=submit]')) b.disabled = off;
  }

  function update(f) {
    const ready = !f.busy && (f.key || f.pending) && performance.now() >= f.quietUntil;
    buttons(f, !ready);
    if (!ready && !f.busy && performance.now() < f.quietUntil) {
      clearTimeout(f.quietTimer);
      f.quietTimer = setTimeout(() => update(f), f.quietUntil - performance.now() + 5);
    }
  }

  async function mint(f) {
    f.key = '';
    update(f);
    try {
      const r = await fetch(TOKENS, {
        method: 'POST',
        credentials: 'same-origin',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ purpose: f.purpose }),
      });
      const d = await r.json();
      if (r.status === 201 && typeof d.token === 'string') {
        f.key = d.token;
        f.failures = 0;
        const left = Date.parse(d.expires_at) - Date.now();
        clearTimeout(f.expiryTimer);
        f.expiryTimer = setTimeout(() => {
          if (!f.busy && !f.pending) mint(f);
        }, Number.isFinite(left) ? Math.max(5000, left - 30000) : 240000);
        update(f);
        return;
      }
      say(f, (d && d.detail) || 'Could not get a one-time key.');
    } catch (_) {
      say(f, 'Could not get a one-time key yet; trying again…');
    }
    f.failures = (f.failures || 0) + 1;
    setTimeout(() => mint(f), Math.min(10000, 500 * 2 ** f.failures));
  }

  // body is the form's fields with the key in the key field (if any), as
  // application/x-www-form-urlencoded.
  function body(f, key) {
    const data = new URLSearchParams(new FormData(f.form));
    if (f.field) data.set(f.field, key);
    return data.toString();
  }

  async function send(f) {
    const p = f.pending;
    f.busy = true;
    update(f);
    const headers = { 'Content-Type': 'application/x-www-form-urlencoded' };
    if (!f.field) headers['Idempotency-Key'] = p.key;
    let r;
    try {
      r = await fetch(p.action, { method: p.method, credentials: 'same-origin', headers, body: p.body });
    } catch (_) {
      say(f, 'The network failed. Press the button again: it sends the same request with the same one-time key, so it cannot happen twice.');
      return settle(f, true);
    }
    const text = await r.text().catch(() => '');
    const ct = r.headers.get('Content-Type') || '';
    let code = '';
    if (ct.includes('problem+json')) {
      try {
        code = JSON.parse(text).code || '';
      } catch (_) {}
    }
    const wait = Math.max(1, Number(r.headers.get('Retry-After')) || 1);
    if (code === 'request_in_progress' && ++f.inProgress <= IN_PROGRESS_MAX) {
      say(f, 'Still being processed; asking again with the same key…');
      setTimeout(() => send(f), wait * 1000);
      return;
    }
    if (code === 'upstream_unavailable' || r.status === 503) {
      say(f, 'The service could not be reached, so nothing was done. Press the button again: it sends the same request with the same key.');
      return settle(f, true);
    }
    if (code === 'duplicate_submission') {
      say(f, `Not sent again: the same form was submitted a moment ago. To really send it twice, wait ${wait} s.`);
      return settle(f, false, false); // the key was not used
    }
    if (code === 'submit_token_invalid' || code === 'submit_token_required' || code === 'idempotency_key_reused') {
      say(f, 'This form’s one-time key was not accepted; a new one is on its way. Nothing was done.');
      return settle(f, false, true);
    }
    const detail = { status: r.status, code, replayed: r.headers.get('Idempotent-Replayed') === 'true', text, contentType: ct, url: r.url };
    settle(f, false, true);
    const ev = new CustomEvent('onceguard:answer', { detail, cancelable: true });
    if (!f.form.dispatchEvent(ev)) return;
    if (ct.startsWith('text/html')) {
      document.open();
      document.write(text);
      document.close();
      return;
    }
    say(f, code === 'upstream_outcome_unknown' ? 'The result is not known: check whether it happened before you submit again.' : text);
  }

  // settle ends a request: keep holds its key and body for a retry, fresh
  // fetches a new key (the old one is spent).
  function settle(f, keep, fresh) {
    f.busy = false;
    f.inProgress = 0;
    if (!keep) f.pending = null;
    f.quietUntil = Math.max(performance.now(), f.lastClick) + QUIET_MS;
    if (fresh) mint(f);
    update(f);
  }

  function attach(form) {
    const f = {
      form,
      purpose: form.dataset.onceguard,
      field: form.dataset.onceguardField || '',
      key: '',
      pending: null,
      busy: false,
      quietUntil: 0,
      lastClick: 0,
      inProgress: 0,
    };
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      f.lastClick = performance.now();
      if (f.busy || performance.now() < f.quietUntil) return;
      if (!f.pending) {
        if (!f.key) return;
        f.pending = {
          key: f.key,
          body: body(f, f.key),
          method: (form.getAttribute('method') || 'POST').toUpperCase(),
          action: form.action,
        };
        f.key = '';
      }
      send(f);
    });
    mint(f);
  }

  const start = () => document.querySelectorAll('form[data-onceguard]').forEach(attach);
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
