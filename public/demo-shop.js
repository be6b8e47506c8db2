// The demo shop's cart (served only with the demo): hold one unit, watch the
// hold count down to its deadline, then pay or release it. Each button calls
// the demo backend, which runs the same engine operations as the checkout API
// (the shopper is this browser's address, for per-buyer limits).
(() => {
  'use strict';
  const cart = document.getElementById('cart');
  if (!cart) return;
  const list = cart.querySelector('ul');
  const empty = cart.querySelector('.empty');
  async function call(path, body) {
    const res = await fetch(path, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    let data = null;
    try { data = await res.json(); } catch (_) { /* not JSON */ }
    return { status: res.status, data };
  }

  function why(r) {
    const outcome = r.data && (r.data.outcome || r.data.state);
    return outcome ? outcome.replace(/_/g, ' ') : `refused (${r.status})`;
  }

  function line(sku) {
    empty.hidden = true;
    const li = document.createElement('li');
    const name = document.createElement('strong');
    name.textContent = sku;
    const left = document.createElement('span');
    left.className = 'left';
    const pay = document.createElement('button');
    pay.type = 'button';
    pay.textContent = 'Pay';
    const release = document.createElement('button');
    release.type = 'button';
    release.textContent = 'Release';
    const note = document.createElement('span');
    note.className = 'note';
    li.append(name, ' ', left, ' ', pay, ' ', release, ' ', note);
    list.append(li);
    return { li, left, pay, release, note };
  }

  function add(sku, hold) {
    const { li, left, pay, release, note } = line(sku);
    li.dataset.reservation = hold.reservation_id;
    li.dataset.state = 'held';
    const finish = (state, text) => {
      clearInterval(timer);
      li.dataset.state = state;
      pay.disabled = true;
      release.disabled = true;
      note.textContent = text;
    };
    const tick = () => {
      const secs = Math.max(0, Math.ceil((hold.expires_at_ms - Date.now()) / 1000));
      left.textContent = `held for ${Math.floor(secs / 60)}:${String(secs % 60).padStart(2, '0')}`;
      if (secs === 0) finish('expired', 'The hold expired: the unit went back on sale.');
    };
    const timer = setInterval(tick, 250);
    tick();
    pay.addEventListener('click', async () => {
      const r = await call('/demo/shop/pay', { reservation_id: hold.reservation_id });
      if (r.status === 200) finish('paid', 'Paid: the sale shows on the dashboard.');
      else note.textContent = why(r);
    });
    release.addEventListener('click', async () => {
      const r = await call('/demo/shop/release', { reservation_id: hold.reservation_id });
      if (r.status === 200) finish('released', 'Released: the unit went back on sale.');
      else note.textContent = why(r);
    });
  }

  document.querySelectorAll('button.hold').forEach((button) => {
    button.addEventListener('click', async () => {
      const sku = button.dataset.sku;
      button.disabled = true;
      try {
        const r = await call('/demo/shop/hold', { sku });
        if (r.status === 201) {
          add(sku, r.data);
        } else {
          const { li, pay, release, note } = line(sku);
          li.dataset.state = 'refused';
          pay.remove();
          release.remove();
          note.textContent = why(r);
        }
      } finally {
        button.disabled = false;
      }
    });
  });
})();
