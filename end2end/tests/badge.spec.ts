// The shopper badge on the demo shop: live over WebSockets within a second of a
// reservation made through the API, still current by polling when a page cannot
// use WebSockets, and counting down to a scheduled drop, then flipping to live
// stock at the start without a reload.
import { test, expect, APIRequestContext } from '@playwright/test';
import { execFileSync } from 'node:child_process';

const token = process.env.HOLDFAST_TOKEN ?? '';

async function reserve(request: APIRequestContext, key: string, sku: string, qty: number) {
  const r = await request.post('/api/v1/reservations', {
    headers: { Authorization: `Bearer ${token}`, 'Idempotency-Key': key },
    // Each key its own buyer: demo SKUs have per-buyer limits.
    data: { sku, qty, ttl_ms: 600000, buyer: `buyer-${key}` },
  });
  expect(r.status(), await r.text()).toBe(201);
  return (await r.json()).id as string;
}

async function release(request: APIRequestContext, id: string) {
  const r = await request.post(`/api/v1/reservations/${id}/release`, { headers: { Authorization: `Bearer ${token}` } });
  expect(r.status()).toBe(200);
}

test('the badge goes low, sold out and back within a second of each change', async ({ page, request }) => {
  expect(token, 'the test script passes an API token').not.toBe('');
  await page.goto('/demo/shop');
  const badge = page.locator('holdfast-stock[sku="DROP-006"]');
  await expect(badge).toHaveText('In stock');
  await expect(badge.getByRole('status')).toHaveAttribute('aria-live', 'polite');

  const first = await reserve(request, 'badge-1', 'DROP-006', 9);
  await expect(badge).toHaveText('Only 3 left', { timeout: 1000 });
  const second = await reserve(request, 'badge-2', 'DROP-006', 3);
  await expect(badge).toHaveText('Sold out', { timeout: 1000 });
  await page.screenshot({ path: 'output/shop-sold-out.png', fullPage: true });

  await release(request, second);
  await expect(badge).toHaveText('Back in stock: only 3 left', { timeout: 1000 });
  // "Back in stock" marks the first change after a sell-out; from low to plenty it is plain "In stock".
  await release(request, first);
  await expect(badge).toHaveText('In stock', { timeout: 1000 });
});

test('a badge speaks its page\'s language', async ({ page }) => {
  await page.goto('/demo/shop');
  await expect(page.locator('holdfast-stock[sku="DROP-006"]')).toHaveText('In stock');
  await page.evaluate(() => {
    for (const lang of ['de', 'fr', 'es', 'xx']) {
      const part = document.createElement('div');
      part.setAttribute('lang', lang);
      part.innerHTML = `<holdfast-stock id="badge-${lang}" sku="DROP-006"></holdfast-stock>`;
      document.body.append(part);
    }
  });
  await expect(page.locator('#badge-de')).toHaveText('Auf Lager');
  await expect(page.locator('#badge-fr')).toHaveText('En stock');
  await expect(page.locator('#badge-es')).toHaveText('Disponible');
  // A language the badge does not know: English.
  await expect(page.locator('#badge-xx')).toHaveText('In stock');
});

test('without WebSockets the badge polls and still updates', async ({ page, request }) => {
  await page.addInitScript(() => { delete (window as { WebSocket?: unknown }).WebSocket; });
  await page.goto('/demo/shop');
  const badge = page.locator('holdfast-stock[sku="DROP-005"]');
  await expect(badge).toHaveText('In stock');
  const id = await reserve(request, 'badge-poll-1', 'DROP-005', 1);
  // DROP-005 has 25 units and a low threshold of 5: 21 held leaves 4.
  const more: string[] = [];
  for (let i = 0; i < 20; i++) more.push(await reserve(request, `badge-poll-${i + 2}`, 'DROP-005', 1));
  await expect(badge).toHaveText('Only 4 left', { timeout: 8000 });
  for (const r of [id, ...more]) await release(request, r);
  await expect(badge).toHaveText('In stock', { timeout: 8000 });
});

/// Sets the demo drop's start with the CLI (`none`: no start).
function scheduleDemo(startsAt: string) {
  const bin = process.env.HOLDFAST_BIN;
  expect(bin, 'the test script passes HOLDFAST_BIN').toBeTruthy();
  return execFileSync(bin!, ['drop', 'schedule', 'winter-launch', '--starts-at', startsAt], { env: process.env }).toString();
}

test('a scheduled drop counts down on the badge and goes live at its start without a reload', async ({ page, request }) => {
  test.setTimeout(60_000);
  // 25 s ahead: a badge already followed picks a new schedule up within the
  // hub's refresh (10 s).
  const start = new Date(Date.now() + 25_000);
  expect(scheduleDemo(start.toISOString())).toContain('counter(s) follow it now');
  try {
    await page.goto('/demo/shop');
    const badge = page.locator('holdfast-stock[sku="DROP-006"]');
    await expect(badge).toHaveText(/^Starts in \d+ s$/, { timeout: 12_000 });
    // A badge on a German part of a page counts down in German.
    await page.evaluate(() => {
      const part = document.createElement('div');
      part.setAttribute('lang', 'de');
      part.innerHTML = '<holdfast-stock id="de-badge" sku="DROP-006"></holdfast-stock>';
      document.body.append(part);
    });
    await expect(page.locator('#de-badge')).toHaveText(/^Beginnt in \d+ Sek\.$/);
    await page.evaluate(() => document.getElementById('de-badge')?.parentElement?.remove());
    await expect(badge).toHaveAttribute('state', 'upcoming');
    const early = await request.post('/api/v1/reservations', {
      headers: { Authorization: `Bearer ${token}`, 'Idempotency-Key': 'too-early-1' },
      data: { sku: 'DROP-006', qty: 1, buyer: 'buyer-too-early-1' },
    });
    expect(early.status()).toBe(409);
    expect((await early.json()).code).toBe('not_started');
    await page.screenshot({ path: 'output/shop-countdown.png', fullPage: true });
    // The flip comes from the page's own timer: no reload, no message needed.
    await expect(badge).toHaveText('In stock', { timeout: 25_000 });
    const id = await reserve(request, 'on-time-1', 'DROP-006', 1);
    await release(request, id);
  } finally {
    scheduleDemo('none');
  }
});
