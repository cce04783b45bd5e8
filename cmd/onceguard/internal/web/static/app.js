// onceguard's page: sign-in, the balance and lists, and four money forms
// that are the first line of defence against duplicate submissions.
//
// One intent, one key: each form holds a one-time submit token (minted by
// the service) and sends it as the Idempotency-Key. The button is disabled
// from the first click until the answer, and stays disabled for a quiet
// moment after it (and until the next token is there), so a double click, a
// burst of clicks or a held Enter key sends one request. A network error or
// a 5xx keeps the same key and body for the retry, which the service then
// answers from its record instead of doing the thing twice; the balance and
// lists refresh at once, since they show whether it went through.
//
// A deposit or withdrawal the payment provider has not settled yet shows
// as pending; while one does, the page asks for the two lists now and then
// (1 s, slowing to 10 s) and, when one has settled, refreshes the balance
// and lists and says so under its form: no reload needed. Asking is only
// reading: the settlement itself happens once, in the service.
//
// The session is the service's HttpOnly SameSite=Strict cookie: the page
// never sees the token. Every POST and DELETE sends JSON with
// Content-Type: application/json, which a cross-site form cannot send.
'use strict';

(() => {
  const API = '/api/v1';
  const QUIET_MS = 700; // after an answer: the button stays off this long after the last click or Enter
  const IN_PROGRESS_MAX = 60; // automatic re-asks while the service says "still in progress"
  const HINT = 'onceguard.signed-in'; // a hint that a session cookie may exist; never the token
  const PAID = 'onceguard.paid-orders'; // payment id -> order no of the payments made here, for the ledger
  const PAID_MAX = 200;
  const POLL_MS = 1000; // while a movement is pending: the first look at the lists after this long
  const POLL_MAX_MS = 10000; // ... slowing down to this
  const AMOUNT = /^(0|[1-9][0-9]*)(\.[0-9]{1,2})?$/;

  const $ = (id) => document.getElementById(id);
  const now = () => performance.now();

  const state = {
    gen: 0, // bumped at each sign-in and sign-out: late answers of the old session are dropped
    currency: '',
    refreshSeq: 0,
    authBusy: false,
    forms: [],
    pending: new Set(), // "deposits/<id>", "withdrawals/<id>": the movements last seen pending
    pollMs: POLL_MS,
    pollTimer: 0,
  };

  // ---- HTTP ----

  class NetworkError extends Error {}

  // call sends one request and returns {status, data, code, replayed,
  // retryAfter}; it throws NetworkError when no answer arrived.
  async function call(method, path, body, key) {
    const headers = { Accept: 'application/json' };
    const init = { method, headers, credentials: 'same-origin', cache: 'no-store', redirect: 'error' };
    if (method !== 'GET') {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body || {});
    }
    if (key) headers['Idempotency-Key'] = key;
    let res;
    let text;
    try {
      res = await fetch(API + path, init);
      text = await res.text();
    } catch (e) {
      throw new NetworkError(String((e && e.message) || e));
    }
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (_) {
        data = null;
      }
    }
    const ra = parseInt(res.headers.get('Retry-After') || '', 10);
    // The next one-time key, offered with a money answer: the form needs no mint for it.
    const nextKey = res.headers.get('Next-Submit-Token') || '';
    return {
      status: res.status,
      data: data && typeof data === 'object' ? data : {},
      code: data && typeof data.code === 'string' ? data.code : '',
      replayed: res.headers.get('Idempotent-Replayed') === 'true',
      retryAfter: Number.isFinite(ra) && ra >= 0 ? ra : null,
      next: nextKey.startsWith('st_') ? { token: nextKey, expiresAt: res.headers.get('Next-Submit-Token-Expires') || '' } : null,
    };
  }

  // ---- small helpers ----

  function say(el, kind, text) {
    el.textContent = text;
    el.className = el.className.replace(/\b(ok|warn|error|info)\b/g, '').trim();
    if (kind) el.classList.add(kind);
  }

  function money(amount) {
    return state.currency ? `${amount} ${state.currency}` : String(amount);
  }

  // decimal2 writes an amount as typed ("1000", "7.5") as the service
  // writes amounts ("1000.00", "7.50"); anything else is left as it is.
  function decimal2(v) {
    const s = String(v);
    if (!AMOUNT.test(s)) return s;
    const [whole, frac = ''] = s.split('.');
    return `${whole}.${(frac + '00').slice(0, 2)}`;
  }

  function when(ts) {
    const d = new Date(ts);
    return Number.isNaN(d.getTime()) ? String(ts) : d.toLocaleString();
  }

  function seconds(n) {
    return n === 1 ? '1 second' : `${n} seconds`;
  }

  function readAmount(input) {
    const v = input.value.trim();
    if (v === '') return { error: 'Enter an amount.', field: input };
    if (!AMOUNT.test(v) || /^0(\.0*)?$/.test(v)) {
      return { error: 'Enter an amount like 10 or 10.50: more than 0, with at most two decimals.', field: input };
    }
    return { value: v };
  }

  function setHint(on) {
    try {
      if (on) localStorage.setItem(HINT, '1');
      else localStorage.removeItem(HINT);
    } catch (_) {
      // storage may be disabled; the hint only saves a request
    }
  }

  function hasHint() {
    try {
      return localStorage.getItem(HINT) === '1';
    } catch (_) {
      return false;
    }
  }

  // The ledger names a payment by its payment id; the orders list links
  // each paid order to it, and the page also keeps the order no of each
  // payment it made, for orders past the list's end.
  function paidOrders() {
    try {
      const m = JSON.parse(localStorage.getItem(PAID) || '{}');
      return m && typeof m === 'object' ? m : {};
    } catch (_) {
      return {};
    }
  }

  function rememberPaid(paymentID, orderNo) {
    if (typeof paymentID !== 'string' || !orderNo) return;
    const m = paidOrders();
    delete m[paymentID];
    m[paymentID] = orderNo;
    const ids = Object.keys(m);
    for (const id of ids.slice(0, Math.max(0, ids.length - PAID_MAX))) delete m[id];
    try {
      localStorage.setItem(PAID, JSON.stringify(m));
    } catch (_) {
      // storage may be disabled: the ledger then shows the payment id
    }
  }

  function ledgerRef(e, paid) {
    return e.kind === 'payment' && paid[e.ref] ? `order ${paid[e.ref]}` : e.ref;
  }

  const movementStatus = {
    succeeded: 'it went through',
    pending: 'the payment provider has not confirmed it yet; it settles by itself, never twice',
    failed: 'the payment provider refused it, so no money moved',
  };

  // ---- the money forms ----

  const specs = {
    deposit: {
      purpose: 'deposit',
      noun: 'deposit',
      list: 'deposits',
      read(form) {
        const a = readAmount(form.elements.amount);
        return a.error ? a : { path: '/deposits', body: { amount: a.value }, amount: a.value };
      },
      done: (d) => `Deposit of ${money(d.amount)}: ${movementStatus[d.status] || d.status}.`,
      clear(form) {
        form.elements.amount.value = '';
      },
    },
    withdraw: {
      purpose: 'withdrawal',
      noun: 'withdrawal',
      list: 'withdrawals',
      read(form) {
        const a = readAmount(form.elements.amount);
        return a.error ? a : { path: '/withdrawals', body: { amount: a.value }, amount: a.value };
      },
      done: (d) =>
        `Withdrawal of ${money(d.amount)}: ${
          d.status === 'failed' ? 'the payment provider refused it, and your balance was refunded' : movementStatus[d.status] || d.status
        }.`,
      clear(form) {
        form.elements.amount.value = '';
      },
    },
    order: {
      purpose: 'order',
      noun: 'order',
      read(form) {
        const a = readAmount(form.elements.amount);
        if (a.error) return a;
        const description = form.elements.description.value.trim();
        if ([...description].length > 200) return { error: 'The description is too long (at most 200 characters).', field: form.elements.description };
        return { path: '/orders', body: { amount: a.value, description }, amount: a.value };
      },
      done: (d) => `Order ${d.order_no} for ${money(d.amount)} created; pay it below.`,
      clear(form) {
        form.elements.amount.value = '';
        form.elements.description.value = '';
      },
    },
    pay: {
      purpose: 'payment',
      noun: 'payment',
      ready: (form) => form.elements.order.value !== '',
      read(form) {
        const id = form.elements.order.value;
        if (!id) return { error: 'There is no unpaid order to pay.', field: form.elements.order };
        const opt = form.elements.order.selectedOptions[0];
        return { path: `/orders/${encodeURIComponent(id)}/payment`, body: { method: 'wallet' }, amount: opt ? opt.dataset.amount : '', orderNo: opt ? opt.dataset.orderNo : '' };
      },
      done: (d, req) => {
        rememberPaid(d.payment_id, req && req.orderNo);
        return `Order paid: ${money(d.amount)} was taken from your balance.`;
      },
      clear() {},
    },
  };

  function keyedForm(form, spec) {
    const f = {
      form,
      spec,
      button: form.querySelector('button[type=submit]'),
      msg: form.querySelector('.msg'),
      keyLine: form.querySelector('.key'),
      label: '',
      key: '', // the submit token this form sends next: one per intent
      minting: false,
      mintFailures: 0,
      offered: null, // {token, expiresAt}: the next key the last answer offered (Next-Submit-Token)
      busy: false, // a request is on its way: nothing else may be sent
      pending: null, // {path, body}: the request a retry must resend, same key, same body
      quietUntil: 0, // no new submission before this time (performance.now())
      lastAttempt: 0,
      inProgressTries: 0,
      refocus: false,
      watch: '', // the id of the pending movement this form's message is about
      timers: {},
    };
    f.label = f.button.textContent;
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      submit(f);
    });
    // Every click and Enter press counts as an attempt, also the ignored
    // ones, so a burst that outlasts the answer is still one intent.
    form.addEventListener(
      'keydown',
      (ev) => {
        if (ev.key !== 'Enter') return;
        attempt(f);
        if (ev.repeat) ev.preventDefault(); // a held key is one press
      },
      true,
    );
    form.addEventListener('pointerdown', () => attempt(f), true);
    form.addEventListener('change', () => update(f));
    return f;
  }

  function attempt(f) {
    const t = now();
    f.lastAttempt = t;
    if (t < f.quietUntil) {
      f.quietUntil = t + QUIET_MS;
      update(f);
    }
  }

  function timer(f, name, ms, fn) {
    clearTimeout(f.timers[name]);
    f.timers[name] = setTimeout(fn, ms);
  }

  function stopTimers(f) {
    for (const name of Object.keys(f.timers)) clearTimeout(f.timers[name]);
    f.timers = {};
  }

  function canSubmit(f) {
    return state.gen > 0 && !f.busy && !f.minting && f.key !== '' && now() >= f.quietUntil && (f.pending !== null || !f.spec.ready || f.spec.ready(f.form));
  }

  function update(f) {
    const t = now();
    const ok = canSubmit(f);
    f.button.disabled = !ok;
    f.form.setAttribute('aria-busy', f.busy ? 'true' : 'false');
    f.button.textContent = f.busy ? 'Sending…' : f.pending ? 'Retry' : f.label;
    let st = 'ready';
    if (f.busy) st = 'busy';
    else if (f.minting || !f.key) st = 'minting';
    else if (f.pending) st = t < f.quietUntil ? 'quiet' : 'retry';
    else if (t < f.quietUntil) st = 'quiet';
    else if (!ok) st = 'idle';
    f.form.dataset.state = st;
    if (f.minting) f.keyLine.textContent = 'Getting a one-time key for this form…';
    else if (f.busy) f.keyLine.textContent = 'Sent with this form’s one-time key; waiting for the answer.';
    else if (f.pending) f.keyLine.textContent = 'Retry uses the same one-time key, so it cannot happen twice.';
    else f.keyLine.textContent = ''; // ready: the page's one note above the forms says what the key does
    for (const el of f.form.elements) {
      if (el === f.button) continue;
      // While a request is on its way or waits for its retry, its inputs
      // are frozen: the retry must send the very same body.
      const frozen = f.busy || f.pending !== null;
      if (el.tagName === 'SELECT') el.disabled = frozen || ![...el.options].some((o) => o.value !== '');
      else el.readOnly = frozen;
    }
    if (t < f.quietUntil) timer(f, 'quiet', f.quietUntil - t + 10, () => update(f));
    if (ok && f.refocus) {
      f.refocus = false;
      // Without a scroll: the user is still at this button (a press or a
      // focus elsewhere cancels the refocus), and a page that jumps under
      // a finger makes the next tap land on something else.
      if (document.activeElement === document.body || document.activeElement === null) f.button.focus({ preventScroll: true });
    }
  }

  function submit(f) {
    if (!canSubmit(f)) return;
    // A new action makes the other forms' old results stale; a form whose
    // request is open or waits for its retry keeps its words.
    for (const g of state.forms) {
      if (g !== f && !g.busy && !g.pending) {
        say(g.msg, '', '');
        g.watch = '';
      }
    }
    let req = f.pending;
    if (!req) {
      const r = f.spec.read(f.form);
      if (r.error) {
        say(f.msg, 'error', r.error);
        if (r.field) r.field.focus();
        return;
      }
      req = r;
    }
    // From here until the answer nothing else is sent: set synchronously,
    // before any await, so the second click of a double click finds it.
    f.busy = true;
    f.watch = '';
    f.pending = req;
    f.inProgressTries = 0;
    f.refocus = document.activeElement === f.button;
    update(f);
    say(f.msg, 'info', 'Sending…');
    send(f);
  }

  async function send(f) {
    const gen = state.gen;
    let r;
    try {
      r = await call('POST', f.pending.path, f.pending.body, f.key);
    } catch (e) {
      if (gen !== state.gen) return;
      if (!(e instanceof NetworkError)) throw e;
      say(
        f.msg,
        'error',
        'No answer from the service (a network problem), so it is not known whether this went through. Press “Retry”: it sends the same request with the same one-time key, so it cannot happen twice.',
      );
      // The outcome is unknown: the lists show whether it went through.
      settle(f, { keep: true, refresh: true });
      return;
    }
    if (gen !== state.gen) return;
    answer(f, r, gen);
  }

  // answer shows one answer of the contract in plain words and decides
  // what the form's key does next: kept for a retry, kept unused, or
  // replaced by a fresh one.
  function answer(f, r, gen) {
    const d = r.data;
    const req = f.pending;
    f.offered = r.next; // used by settle when the answer spent the key
    if (r.status >= 200 && r.status < 300) {
      const what = f.spec.done(d, req);
      if (f.spec.list && d.status === 'pending' && typeof d.id === 'string') {
        f.watch = d.id; // its final status replaces these words when it comes
        state.pollMs = POLL_MS;
      }
      if (r.replayed) {
        say(f.msg, 'ok', `Already submitted — here is the result of your earlier submission; nothing was done twice. ${what}`);
      } else {
        say(f.msg, 'ok', `Done. ${what}`);
      }
      f.spec.clear(f.form);
      settle(f, { fresh: true, refresh: true });
      return;
    }
    switch (r.code) {
      case 'request_in_progress':
      case 'payment_in_progress': {
        const wait = Math.max(1, r.retryAfter || 1);
        if (++f.inProgressTries > IN_PROGRESS_MAX) {
          say(f.msg, 'warn', 'Still being processed after a long time. Press “Retry” to ask again; it uses the same one-time key, so it cannot happen twice.');
          settle(f, { keep: true, refresh: true });
          return;
        }
        say(
          f.msg,
          'warn',
          r.code === 'request_in_progress'
            ? `Still being processed: your earlier submission reached the service and has not finished yet. Checking again in ${seconds(wait)} with the same key, so it cannot happen twice.`
            : `Another payment of this order is being processed right now. Checking again in ${seconds(wait)}.`,
        );
        timer(f, 'again', wait * 1000, () => {
          if (gen === state.gen && f.busy) send(f);
        });
        return; // still busy: the button stays disabled
      }
      case 'duplicate_submission': {
        const wait = r.retryAfter || 1;
        say(
          f.msg,
          'warn',
          `Not sent again: this is the same ${f.spec.noun} you submitted a moment ago (its result is in the lists below). If you really want a second one, wait ${seconds(wait)} and submit again.`,
        );
        settle(f, { refresh: true }); // nothing was recorded: the key is still unused; the lists show the earlier one
        return;
      }
      case 'insufficient_funds':
        say(f.msg, 'error', `Not enough money: your balance does not cover ${money(decimal2(req.amount || ''))}. Nothing was changed.`);
        settle(f, { fresh: true, refresh: true });
        return;
      case 'balance_limit':
        // Recorded under the key like insufficient_funds: the next
        // submission needs a fresh one.
        say(f.msg, 'error', `That deposit would take your balance past the largest one the service keeps (${d.detail || 'see the limits'}). Nothing was changed.`);
        settle(f, { fresh: true, refresh: true });
        return;
      case 'order_already_paid':
        say(f.msg, 'warn', 'This order is already paid, so it was not charged again.');
        settle(f, { fresh: true, refresh: true });
        return;
      case 'not_found':
        say(f.msg, 'error', 'That order does not exist (or is not yours). Nothing was charged.');
        settle(f, { fresh: true, refresh: true });
        return;
      case 'submit_token_invalid':
      case 'submit_token_required':
        say(f.msg, 'error', 'This form’s one-time key was not accepted (it expired, or was used for something else). Nothing was done. A new key is on its way: submit again when the button is ready.');
        settle(f, { fresh: true });
        return;
      case 'idempotency_key_reused':
        say(f.msg, 'error', 'This one-time key was already used for a different request, so nothing was done. A new key is on its way: submit again when the button is ready.');
        settle(f, { fresh: true, refresh: true });
        return;
      case 'unauthenticated':
        signedOut('Your session has expired. Sign in again; the last action was not carried out.', 'error');
        return;
      case 'invalid_amount':
        say(f.msg, 'error', `That amount is not accepted (${d.detail || 'check it'}). Nothing was done.`);
        settle(f, {});
        return;
      default:
        break;
    }
    if (r.status >= 500) {
      const wait = r.retryAfter ? ` Wait ${seconds(r.retryAfter)}, then press` : ' Press';
      say(
        f.msg,
        'error',
        `The service could not finish this right now (${d.title || r.status}).${wait} “Retry”: it sends the same request with the same one-time key, so it cannot happen twice.`,
      );
      // Whether it went through is not known (a proxy may have answered
      // after the service did the work): the lists show it.
      settle(f, { keep: true, refresh: true });
      return;
    }
    // Any other refusal came before the key was recorded: the key is unused.
    say(f.msg, 'error', `Not done: ${d.title || `error ${r.status}`}${d.detail ? ` (${d.detail})` : ''}.`);
    settle(f, {});
  }

  // settle ends a request: keep holds its key and body for a retry, fresh
  // takes a new key (the old one is spent): the one the answer offered, else
  // a minted one; refresh reloads the page's data.
  function settle(f, { keep = false, fresh = false, refresh = false }) {
    clearTimeout(f.timers.again);
    f.busy = false;
    if (!keep) f.pending = null;
    f.quietUntil = Math.max(now(), f.lastAttempt) + QUIET_MS;
    const offered = f.offered;
    f.offered = null;
    if (fresh && offered) useKey(f, offered.token, offered.expiresAt);
    else if (fresh) mint(f);
    update(f);
    if (refresh) refreshAll();
  }

  // useKey makes token the form's key, and fetches a fresh one shortly
  // before it expires unused.
  function useKey(f, token, expiresAt) {
    const gen = state.gen;
    f.key = token;
    f.minting = false;
    f.mintFailures = 0;
    const left = Date.parse(expiresAt) - Date.now();
    const ms = Number.isFinite(left) ? Math.max(5000, left - 30000) : 240000;
    timer(f, 'expiry', ms, () => {
      if (gen === state.gen && !f.busy && !f.pending) mint(f);
    });
    update(f);
  }

  async function mint(f) {
    const gen = state.gen;
    f.key = '';
    f.minting = true;
    clearTimeout(f.timers.expiry);
    update(f);
    let r = null;
    try {
      r = await call('POST', '/submit-tokens', { purpose: f.spec.purpose });
    } catch (_) {
      r = null;
    }
    if (gen !== state.gen) return;
    if (r && r.status === 201 && typeof r.data.token === 'string') {
      useKey(f, r.data.token, r.data.expires_at);
      return;
    }
    if (r && r.code === 'unauthenticated') {
      signedOut('Your session has expired. Sign in again.', 'error');
      return;
    }
    f.mintFailures++;
    f.keyLine.textContent = 'Could not get a one-time key yet (network or service trouble); trying again…';
    timer(f, 'mint', Math.min(10000, 500 * 2 ** f.mintFailures), () => {
      if (gen === state.gen) mint(f);
    });
  }

  // ---- the lists ----

  function rows(tbody, items, cells) {
    const trs = items.map((it) => {
      const tr = document.createElement('tr');
      for (const [text, cls] of cells(it)) {
        const td = document.createElement('td');
        td.textContent = text;
        if (cls) td.className = cls;
        tr.append(td);
      }
      return tr;
    });
    if (trs.length === 0) {
      const tr = document.createElement('tr');
      const td = document.createElement('td');
      td.colSpan = tbody.parentElement.querySelectorAll('th').length;
      td.className = 'muted';
      td.textContent = 'Nothing yet.';
      tr.append(td);
      trs.push(tr);
    }
    tbody.replaceChildren(...trs);
  }

  const kinds = { deposit: 'Deposit', withdrawal: 'Withdrawal', withdrawal_refund: 'Refund of a withdrawal', payment: 'Order payment' };
  const statuses = { succeeded: 'succeeded', pending: 'pending (settles by itself)', failed: 'failed', created: 'unpaid', paid: 'paid' };

  function renderAccount(a) {
    state.currency = a.currency || state.currency;
    $('balance').textContent = money(a.balance);
    $('who-name').textContent = a.username;
  }

  function renderOrders(items) {
    rows($('orders').tBodies[0], items, (o) => [[when(o.created_at), 'when'], [o.order_no, 'what'], [o.description || '—', 'ref'], [money(o.amount), 'num amount'], [statuses[o.status] || o.status, 'status']]);
    const pay = state.forms.find((f) => f.spec === specs.pay);
    if (!pay || pay.busy || pay.pending) return; // frozen while its request is open
    const select = pay.form.elements.order;
    const keep = select.value;
    const unpaid = items.filter((o) => o.status === 'created');
    const opts = unpaid.map((o) => {
      const opt = document.createElement('option');
      opt.value = o.id;
      opt.dataset.amount = o.amount;
      opt.dataset.orderNo = o.order_no;
      opt.textContent = `${o.order_no} · ${money(o.amount)}${o.description ? ` · ${o.description}` : ''}`;
      return opt;
    });
    if (opts.length === 0) {
      const none = document.createElement('option');
      none.value = '';
      none.textContent = 'No unpaid orders';
      opts.push(none);
    }
    select.replaceChildren(...opts);
    if (unpaid.some((o) => o.id === keep)) select.value = keep;
    update(pay);
  }

  function list(r) {
    return r.status === 200 && Array.isArray(r.data.items) ? r.data.items : null;
  }

  // watchPending takes the movement lists of a refresh: a form whose
  // message is about a movement that has settled since says how it ended,
  // and while any movement is pending, a look at the lists is scheduled.
  function watchPending(lists) {
    for (const f of state.forms) {
      if (!f.watch || !f.spec.list || f.busy || f.pending) continue;
      const m = lists[f.spec.list].find((x) => x.id === f.watch);
      if (m && m.status !== 'pending') {
        say(f.msg, m.status === 'failed' ? 'warn' : 'ok', `Settled. ${f.spec.done(m)}`);
        f.watch = '';
      }
    }
    state.pending = pendingOf(lists);
    schedulePoll();
  }

  // schedulePoll plans the next look at the lists while a movement is
  // pending, each a little later than the last.
  function schedulePoll() {
    clearTimeout(state.pollTimer);
    if (state.pending.size === 0) {
      state.pollMs = POLL_MS;
      return;
    }
    const gen = state.gen;
    state.pollTimer = setTimeout(() => {
      if (gen === state.gen) poll();
    }, state.pollMs);
    state.pollMs = Math.min(POLL_MAX_MS, Math.round(state.pollMs * 1.5));
  }

  function pendingOf(lists) {
    const out = new Set();
    for (const [name, items] of Object.entries(lists)) for (const m of items) if (m.status === 'pending') out.add(`${name}/${m.id}`);
    return out;
  }

  // poll reads the two movement lists; when a movement seen pending has
  // settled, the whole page refreshes (the balance and ledger moved too).
  async function poll() {
    const gen = state.gen;
    let rs;
    try {
      rs = await Promise.all(['/deposits', '/withdrawals'].map((p) => call('GET', p)));
    } catch (_) {
      rs = null;
    }
    if (gen !== state.gen) return;
    if (rs && rs.some((r) => r.status === 401)) {
      signedOut('Your session has expired. Sign in again.', 'error');
      return;
    }
    const dep = rs && list(rs[0]);
    const wd = rs && list(rs[1]);
    if (!dep || !wd) {
      schedulePoll(); // asked again later, the pending ones as they were
      return;
    }
    const still = pendingOf({ deposits: dep, withdrawals: wd });
    if ([...state.pending].some((id) => !still.has(id))) {
      refreshAll(); // it renders the lists and watches what is still pending
      return;
    }
    watchPending({ deposits: dep, withdrawals: wd });
  }

  async function refreshAll() {
    const gen = state.gen;
    const seq = ++state.refreshSeq;
    let rs;
    try {
      rs = await Promise.all(['/account', '/ledger', '/deposits', '/withdrawals', '/orders'].map((p) => call('GET', p)));
    } catch (_) {
      if (gen === state.gen) {
        say($('refresh-msg'), 'warn', 'Could not refresh the balance and lists (network problem); they refresh after your next action.');
        schedulePoll(); // a pending movement is still looked after
      }
      return;
    }
    if (gen !== state.gen || seq !== state.refreshSeq) return; // a newer refresh wins
    if (rs.some((r) => r.status === 401)) {
      signedOut('Your session has expired. Sign in again.', 'error');
      return;
    }
    const [account, ledger, deposits, withdrawals, orders] = rs;
    if (account.status === 200) renderAccount(account.data);
    const l = list(ledger);
    const paid = paidOrders();
    // The orders list names the payment of each paid order, wherever it was made.
    for (const o of list(orders) || []) if (typeof o.payment_id === 'string' && o.order_no) paid[o.payment_id] = o.order_no;
    if (l) rows($('ledger').tBodies[0], l, (e) => [[when(e.created_at), 'when'], [kinds[e.kind] || e.kind, 'what'], [money(e.amount), 'num amount'], [money(e.balance_after), 'num after'], [ledgerRef(e, paid), 'ref']]);
    const dep = list(deposits);
    if (dep) rows($('deposits').tBodies[0], dep, (m) => [[when(m.created_at), 'when'], [money(m.amount), 'num amount'], [statuses[m.status] || m.status, 'status'], [m.id, 'ref']]);
    const wd = list(withdrawals);
    if (wd) rows($('withdrawals').tBodies[0], wd, (m) => [[when(m.created_at), 'when'], [money(m.amount), 'num amount'], [statuses[m.status] || m.status, 'status'], [m.id, 'ref']]);
    const ord = list(orders);
    if (ord) renderOrders(ord);
    if (dep && wd) watchPending({ deposits: dep, withdrawals: wd });
    else schedulePoll();
    if (rs.every((r) => r.status === 200)) say($('refresh-msg'), '', '');
    else say($('refresh-msg'), 'warn', 'Some of the lists could not be loaded just now; they refresh after your next action.');
  }

  // ---- session ----

  function show(view) {
    $('loading').hidden = true;
    $('auth').hidden = view !== 'auth';
    $('app').hidden = view !== 'app';
    $('who').hidden = view !== 'app';
  }

  function resetForm(f) {
    stopTimers(f);
    f.key = '';
    f.offered = null;
    f.minting = false;
    f.busy = false;
    f.pending = null;
    f.watch = '';
    f.quietUntil = 0;
    f.mintFailures = 0;
    f.spec.clear(f.form);
    say(f.msg, '', '');
    f.keyLine.textContent = '';
    update(f);
  }

  function signedIn(account) {
    state.gen++;
    clearTimeout(state.pollTimer);
    state.pending = new Set();
    state.pollMs = POLL_MS;
    setHint(true);
    renderAccount(account);
    for (const f of state.forms) {
      resetForm(f);
      mint(f);
    }
    say($('auth-msg'), '', '');
    $('password').value = '';
    show('app');
    refreshAll();
  }

  function signedOut(message, kind) {
    state.gen++;
    clearTimeout(state.pollTimer);
    state.pending = new Set();
    setHint(false);
    for (const f of state.forms) resetForm(f);
    for (const id of ['ledger', 'deposits', 'withdrawals', 'orders']) $(id).tBodies[0].replaceChildren();
    $('pay-order').replaceChildren();
    $('balance').textContent = '…';
    show('auth');
    say($('auth-msg'), kind || 'info', message || '');
    $('username').focus();
  }

  async function onAuth(ev) {
    ev.preventDefault();
    if (state.authBusy) return;
    const signup = ev.submitter && ev.submitter.value === 'signup';
    const username = $('username').value.trim();
    const password = $('password').value;
    const msg = $('auth-msg');
    if (!/^[a-z0-9_]{3,32}$/.test(username)) {
      say(msg, 'error', 'The username must be 3 to 32 characters: lowercase letters, digits and _.');
      $('username').focus();
      return;
    }
    if (password.length < 8) {
      say(msg, 'error', 'The password must be at least 8 characters.');
      $('password').focus();
      return;
    }
    state.authBusy = true;
    $('signin').disabled = true;
    $('signup').disabled = true;
    say(msg, 'info', signup ? 'Creating your account…' : 'Signing in…');
    try {
      if (signup) {
        const r = await call('POST', '/users', { username, password });
        if (r.status !== 201) {
          const words = {
            username_taken: 'That username is taken; choose another, or sign in.',
            invalid_username: 'The username must be 3 to 32 characters: lowercase letters, digits and _.',
            invalid_password: 'The password must be 8 to 128 bytes long.',
            too_many_signups: 'Too many accounts were created from this address lately; try again later.',
          };
          say(msg, 'error', words[r.code] || `Could not create the account (${r.data.title || r.status}).`);
          return;
        }
      }
      const s = await call('POST', '/sessions', { username, password });
      if (s.status !== 201) {
        say(msg, 'error', s.code === 'invalid_credentials' ? 'Wrong username or password.' : `Could not sign in (${s.data.title || s.status}).`);
        return;
      }
      const a = await call('GET', '/account');
      if (a.status !== 200) {
        say(msg, 'error', `Signed in, but the account could not be loaded (${a.data.title || a.status}). Try again.`);
        return;
      }
      signedIn(a.data);
    } catch (e) {
      if (!(e instanceof NetworkError)) throw e;
      say(msg, 'error', 'No answer from the service (a network problem). Try again.');
    } finally {
      state.authBusy = false;
      $('signin').disabled = false;
      $('signup').disabled = false;
    }
  }

  async function onSignOut() {
    const button = $('signout');
    if (button.disabled) return;
    button.disabled = true;
    try {
      const r = await call('DELETE', '/sessions/current', {});
      if (r.status === 204 || r.status === 401) signedOut('You are signed out.', 'info');
      else say($('refresh-msg'), 'error', `Could not sign out (${r.data.title || r.status}). Try again.`);
    } catch (e) {
      if (!(e instanceof NetworkError)) throw e;
      say($('refresh-msg'), 'error', 'Could not reach the service to sign out. Try again.');
    } finally {
      button.disabled = false;
    }
  }

  async function boot() {
    $('auth-form').addEventListener('submit', onAuth);
    $('signout').addEventListener('click', onSignOut);
    state.forms = [
      keyedForm($('deposit-form'), specs.deposit),
      keyedForm($('withdraw-form'), specs.withdraw),
      keyedForm($('order-form'), specs.order),
      keyedForm($('pay-form'), specs.pay),
    ];
    for (const f of state.forms) update(f);
    // A form gives the focus back to its button when its answer is in, for
    // a keyboard user who pressed it; once the user has moved on (a press
    // or a focus anywhere else) it must not take the focus back.
    const movedOn = (ev) => {
      for (const f of state.forms) if (!f.form.contains(ev.target)) f.refocus = false;
    };
    document.addEventListener('focusin', movedOn, true);
    document.addEventListener('pointerdown', movedOn, true);
    // Only ask for the account when a session may exist: a first visit
    // then makes no request that is bound to fail.
    if (!hasHint()) {
      signedOut('', '');
      return;
    }
    try {
      const r = await call('GET', '/account');
      if (r.status === 200) signedIn(r.data);
      else signedOut(r.status === 401 ? 'Your session has ended. Sign in again.' : `The service answered ${r.status}; sign in again.`, 'info');
    } catch (e) {
      if (!(e instanceof NetworkError)) throw e;
      signedOut('Could not reach the service. Check the connection and reload the page.', 'error');
    }
  }

  document.addEventListener('DOMContentLoaded', boot);
})();
