// The shopper badge on the demo shop: live over WebSockets within a second of a
// reservation made through the API, and still current by polling when a page
// cannot use WebSockets.
import { test, expect, APIRequestContext } from '@playwright/test';

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
