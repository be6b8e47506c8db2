/* Holdfast stock badge. Embed on any page:
 *   <script src="https://<holdfast-host>/widget.js" async></script>
 *   <holdfast-stock sku="DROP-001"></holdfast-stock>
 * Every badge on a page shares one WebSocket; when WebSockets are unavailable the
 * badges poll a cacheable JSON endpoint. Theme with CSS custom properties:
 * --holdfast-bg, --holdfast-color, --holdfast-low-bg, --holdfast-low-color,
 * --holdfast-soldout-bg, --holdfast-soldout-color, --holdfast-upcoming-bg,
 * --holdfast-upcoming-color, --holdfast-radius,
 * --holdfast-font-size, --holdfast-padding. */
(() => {
  if (customElements.get('holdfast-stock')) return;
  const src = document.currentScript && document.currentScript.src;
  const origin = new URL(src || location.href).origin;
  const MAX = 20;
  const els = new Map(); // sku -> Set of elements
  const last = new Map(); // sku -> last badge shown
  let ws = null, tries = 0, polling = null, pending = false, waiting = false;

  const CSS = `:host{display:inline-block;font:inherit}
.b{display:inline-flex;align-items:center;gap:.45em;padding:var(--holdfast-padding,.2em .65em);
border-radius:var(--holdfast-radius,999px);font-size:var(--holdfast-font-size,.9em);font-weight:600;
background:var(--holdfast-bg,#e8f5ee);color:var(--holdfast-color,#0b6e4f)}
.b[data-state=low]{background:var(--holdfast-low-bg,#fff3dc);color:var(--holdfast-low-color,#7a4300)}
.b[data-state=sold_out]{background:var(--holdfast-soldout-bg,#fdeaea);color:var(--holdfast-soldout-color,#9b1c1c)}
.b[data-state=unknown],.b[data-state=loading],.b[data-state=ended]{background:#f0f1f3;color:#4a5260}
.b[data-state=upcoming]{background:var(--holdfast-upcoming-bg,#e8eefc);color:var(--holdfast-upcoming-color,#1d3f8f)}
.d{width:.55em;height:.55em;border-radius:50%;background:currentColor}`;

  // The drop's schedule: before `starts_at` a countdown, from `ends_at` "Sale
  // ended" (Unix ms; the sale itself opens by the server's clock, this only shows it).
  function phase(b) {
    const now = Date.now();
    if (b.starts_at && now < b.starts_at) return 'upcoming';
    if (b.ends_at && now >= b.ends_at) return 'ended';
    return 'live';
  }

  // The badge speaks its page's language (the nearest lang attribute, else the
  // browser's): English, German, French or Spanish; English otherwise.
  const WORDS = {
    en: { checking: 'Checking stock…', starts: 'Starts in {t}', ended: 'Sale ended', backOnly: 'Back in stock: only {n} left',
      only: 'Only {n} left', back: 'Back in stock', in_stock: 'In stock', sold_out: 'Sold out', none: 'Not available',
      d: 'd', h: 'h', min: 'min', s: 's' },
    de: { checking: 'Bestand wird geprüft…', starts: 'Beginnt in {t}', ended: 'Verkauf beendet', backOnly: 'Wieder da: nur noch {n}',
      only: 'Nur noch {n}', back: 'Wieder auf Lager', in_stock: 'Auf Lager', sold_out: 'Ausverkauft', none: 'Nicht erhältlich',
      d: 'T', h: 'Std.', min: 'Min.', s: 'Sek.' },
    fr: { checking: 'Vérification du stock…', starts: 'Commence dans {t}', ended: 'Vente terminée', backOnly: 'De retour : plus que {n}',
      only: 'Plus que {n}', back: 'De retour en stock', in_stock: 'En stock', sold_out: 'Épuisé', none: 'Indisponible',
      d: 'j', h: 'h', min: 'min', s: 's' },
    es: { checking: 'Comprobando existencias…', starts: 'Empieza en {t}', ended: 'Venta terminada', backOnly: 'De nuevo: solo quedan {n}',
      only: 'Solo quedan {n}', back: 'De nuevo disponible', in_stock: 'Disponible', sold_out: 'Agotado', none: 'No disponible',
      d: 'd', h: 'h', min: 'min', s: 's' },
  };

  function wordsFor(el) {
    const near = el.closest('[lang]');
    const tag = ((near && near.getAttribute('lang')) || navigator.language || 'en').toLowerCase().split('-')[0];
    return WORDS[tag] || WORDS.en;
  }

  function countdown(ms, w) {
    const s = Math.max(1, Math.ceil(ms / 1000));
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    if (d) return d + ' ' + w.d + ' ' + h + ' ' + w.h;
    if (h) return h + ' ' + w.h + ' ' + String(m).padStart(2, '0') + ' ' + w.min;
    if (m) return m + ' ' + w.min + ' ' + String(s % 60).padStart(2, '0') + ' ' + w.s;
    return s + ' ' + w.s;
  }

  function label(b, prev, w) {
    const p = phase(b);
    if (p === 'upcoming') return w.starts.replace('{t}', countdown(b.starts_at - Date.now(), w));
    if (p === 'ended') return w.ended;
    const back = prev && prev.state === 'sold_out' && (b.state === 'in_stock' || b.state === 'low');
    if (b.state === 'low') return (back ? w.backOnly : w.only).replace('{n}', b.left);
    if (b.state === 'in_stock') return back ? w.back : w.in_stock;
    if (b.state === 'sold_out') return w.sold_out;
    return w.none;
  }

  function shown(b) { const p = phase(b); return p === 'live' ? b.state : p; }

  function show(b) {
    const prev = last.get(b.sku);
    if (prev && prev.state === b.state && prev.left === b.left && prev.starts_at === b.starts_at
      && prev.ends_at === b.ends_at && phase(prev) === 'live') return;
    last.set(b.sku, b);
    for (const el of els.get(b.sku) || []) el._show(b, prev);
    if (phase(b) !== 'live' || b.ends_at) tick();
  }

  // One timer for every badge with a schedule: counts down each second, and
  // flips to live stock at the start and to "Sale ended" at the end, without a
  // reload or a message from the server.
  let ticking = null;
  function tick() {
    if (ticking) return;
    ticking = setInterval(() => {
      let any = false;
      for (const b of last.values()) {
        if (!b.starts_at && !b.ends_at) continue;
        if (phase(b) === 'upcoming' || (b.ends_at && Date.now() < b.ends_at)) any = true;
        for (const el of els.get(b.sku) || []) el._show(b, null);
      }
      if (!any) { clearInterval(ticking); ticking = null; }
    }, 1000);
  }

  function skus() { return [...els.keys()].slice(0, MAX); }

  function subscribe() {
    if (pending) return;
    pending = true;
    queueMicrotask(() => {
      pending = false;
      if (ws && ws.readyState === 1) ws.send(JSON.stringify({ subscribe: skus() }));
      else if (!ws && !waiting) connect();
      if (polling) poll();
    });
  }

  function startPolling() {
    if (polling) return;
    polling = setInterval(poll, 5000);
    poll();
  }

  function stopPolling() { clearInterval(polling); polling = null; }

  async function poll() {
    const list = skus();
    if (!list.length) return;
    try {
      // The server sends an ETag; 'no-cache' revalidates it, so unchanged polls are 304s.
      const r = await fetch(origin + '/public/stock?skus=' + encodeURIComponent(list.join(',')),
        { cache: 'no-cache', credentials: 'omit' });
      if (r.ok) (await r.json()).forEach(show);
    } catch (_) { /* offline: the next poll retries */ }
  }

  // One socket at a time: a page's badges share it, and a closed one is
  // replaced after a backoff, never twice.
  function connect() {
    if (ws) return;
    if (typeof WebSocket !== 'function') { startPolling(); return; }
    let opened = false, sock;
    try { sock = ws = new WebSocket(origin.replace(/^http/, 'ws') + '/public/ws'); } catch (_) { ws = null; startPolling(); return; }
    sock.onopen = () => { opened = true; tries = 0; stopPolling(); sock.send(JSON.stringify({ subscribe: skus() })); };
    sock.onmessage = (m) => {
      try {
        const b = JSON.parse(m.data);
        if (b.sku) show(b);
        // Refused for now (too many subscribes from this address): ask again
        // on this socket, jittered; a socket closed meanwhile resubscribes when
        // the next one opens.
        else if (b.retry_after) {
          setTimeout(() => {
            if (ws === sock && sock.readyState === 1) sock.send(JSON.stringify({ subscribe: skus() }));
          }, (b.retry_after * 1000) * (1 + Math.random()));
        }
      } catch (_) {}
    };
    sock.onclose = () => {
      if (ws !== sock) return;
      ws = null;
      if (!opened) startPolling();
      // Jittered exponential backoff, so a server restart is not met by every page at once.
      const delay = Math.min(30000, 500 * 2 ** tries++) * (0.5 + Math.random() / 2);
      waiting = true;
      setTimeout(() => { waiting = false; connect(); }, delay);
    };
  }

  class HoldfastStock extends HTMLElement {
    connectedCallback() {
      if (!this.shadowRoot) {
        const root = this.attachShadow({ mode: 'open' });
        root.innerHTML = `<style>${CSS}</style><span class="b" part="badge" data-state="loading" role="status" aria-live="polite"><span class="d" aria-hidden="true"></span><span class="l"></span></span>`;
        root.querySelector('.l').textContent = wordsFor(this).checking;
      }
      this._sku = (this.getAttribute('sku') || '').trim();
      if (!this._sku) return;
      if (!els.has(this._sku)) els.set(this._sku, new Set());
      els.get(this._sku).add(this);
      const b = last.get(this._sku);
      if (b) this._show(b, null);
      subscribe();
    }
    disconnectedCallback() {
      const set = els.get(this._sku);
      if (set) { set.delete(this); if (!set.size) { els.delete(this._sku); subscribe(); } }
    }
    _show(b, prev) { this._set(shown(b), label(b, prev, wordsFor(this))); }
    _set(state, text) {
      const b = this.shadowRoot.querySelector('.b');
      const l = b.querySelector('.l');
      if (b.dataset.state === state && l.textContent === text) return;
      b.dataset.state = state;
      // A countdown changes every second: not announced to screen readers.
      b.setAttribute('aria-live', state === 'upcoming' ? 'off' : 'polite');
      l.textContent = text;
      this.setAttribute('state', state);
    }
  }
  customElements.define('holdfast-stock', HoldfastStock);
})();
