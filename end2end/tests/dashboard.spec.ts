// The dashboard in Chromium against the server the test script starts with the
// demo drop: sign-in, live figures, releasing holds by role, a forged call
// refused, a drop set up from a CSV by a merchandiser, locks, the warm-up progress bar, a
// 10,000-SKU drop paged and live, and a screenshot of every page.
import { test, expect, Page, APIRequestContext } from '@playwright/test';
import { execFileSync } from 'node:child_process';

const token = process.env.HOLDFAST_TOKEN ?? '';
const password = process.env.HOLDFAST_DEMO_PASSWORD ?? 'holdfast-demo';

async function signIn(page: Page, username: string) {
  await page.goto('/login');
  await expect(page.locator('main')).toHaveAttribute('data-hydrated', 'true');
  await page.getByLabel('Username').fill(username);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await expect(page.locator('.topbar .user')).toContainText(username);
}

async function live(page: Page) {
  // Hydration compiles the debug WASM bundle: seconds on a busy 2-core machine.
  await expect(page.locator('main')).toHaveAttribute('data-hydrated', 'true', { timeout: 15000 });
  await expect(page.locator('.conn')).toHaveText('live');
}

async function reserve(request: APIRequestContext, key: string, sku: string, qty: number) {
  const r = await request.post('/api/v1/reservations', {
    headers: { Authorization: `Bearer ${token}`, 'Idempotency-Key': key },
    data: { sku, qty, ttl_ms: 600000, buyer: `buyer-${key}` },
  });
  expect(r.status(), await r.text()).toBe(201);
  return (await r.json()).id as string;
}

function cell(page: Page, sku: string, field: string) {
  return page.locator(`tr[data-sku="${sku}"] td[data-field="${field}"]`);
}

function number(text: string | null) {
  return Number((text ?? '').replace(/,/g, ''));
}

test('signing in is required, and wrong passwords say so', async ({ page }) => {
  await page.goto('/');
  await expect(page).toHaveURL(/\/login$/);
  await expect(page.locator('main')).toHaveAttribute('data-hydrated', 'true');
  await page.getByLabel('Username').fill('admin');
  await page.getByLabel('Password').fill('not-the-password');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await expect(page.getByRole('alert')).toHaveText('That username and password do not match.');
  await page.screenshot({ path: 'output/login.png', fullPage: true });
});

test('the overview changes within a second of a reservation made through the API', async ({ page, request }) => {
  const errors: string[] = [];
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  await signIn(page, 'admin');
  await expect(page.getByRole('heading', { level: 1 })).toHaveText('Winter Launch Drop');
  await expect(page.locator('tr[data-sku]')).toHaveCount(6);
  await live(page);
  const available = cell(page, 'DROP-002', 'available');
  const before = number(await available.textContent());
  const reservedBefore = number(await cell(page, 'DROP-002', 'reserved').textContent());
  // DROP-002 allows two per buyer.
  await reserve(request, 'overview-1', 'DROP-002', 2);
  await expect(available).toHaveText(String(before - 2), { timeout: 1000 });
  await expect(cell(page, 'DROP-002', 'reserved')).toHaveText(String(reservedBefore + 2), { timeout: 1000 });

  // The filter works on the hydrated page.
  await page.getByPlaceholder('SKU, title or product').fill('hoodie');
  await expect(page.locator('tr[data-sku]:visible')).toHaveCount(3);
  await page.getByPlaceholder('SKU, title or product').fill('');
  await page.screenshot({ path: 'output/overview.png', fullPage: true });
  expect(errors).toEqual([]);
});

test('support releases a hold on the SKU page and available rises', async ({ page, request }) => {
  const id = await reserve(request, 'sku-page-1', 'DROP-003', 2);
  await signIn(page, 'support');
  await page.goto('/sku/DROP-003');
  await live(page);
  const tile = page.locator('.tile [data-field="available"]');
  const before = number(await tile.textContent());
  const row = page.locator(`tr[data-reservation="${id}"]`);
  await expect(row).toBeVisible();
  await expect(row.locator('td').nth(3)).toHaveText(/\d+m \d\ds/);
  await page.screenshot({ path: 'output/sku.png', fullPage: true });
  await row.getByRole('button', { name: 'Release' }).click();
  await expect(page.getByRole('status').filter({ hasText: `Released ${id}` })).toBeVisible();
  await expect(tile).toHaveText(String(before + 2), { timeout: 1000 });
  await expect(page.locator('ol.events li[data-kind="released"]').first()).toContainText(id);
});

test('a viewer sees no release button and a forged release from the page is refused', async ({ page, request }) => {
  const id = await reserve(request, 'viewer-1', 'DROP-003', 1);
  await signIn(page, 'viewer');
  await page.goto('/sku/DROP-003');
  await live(page);
  const row = page.locator(`tr[data-reservation="${id}"]`);
  await expect(row).toBeVisible();
  await expect(page.getByRole('button', { name: 'Release' })).toHaveCount(0);
  const status = await page.evaluate(async (rid) => {
    const r = await fetch('/api/release_hold', {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: `reservation_id=${rid}&reason=forged`,
    });
    return { status: r.status, text: await r.text() };
  }, id);
  expect(status.status).toBe(403);
  expect(status.text).toContain('cannot do this');
  await page.reload();
  await expect(page.locator(`tr[data-reservation="${id}"]`)).toBeVisible();
  // Admin pages are not in a viewer's menu.
  await expect(page.getByRole('link', { name: 'Users & tokens' })).toHaveCount(0);
});

test('the locks page shows a lock a test took, live, and an admin can force it', async ({ page }) => {
  const bin = process.env.HOLDFAST_BIN;
  expect(bin, 'the test script passes HOLDFAST_BIN').toBeTruthy();
  const out = execFileSync(bin!, ['lock', 'take', 'e2e-maintenance', '--ttl-secs', '120'], { env: process.env }).toString();
  const fence = out.match(/fencing token (\d+)/)![1];
  await signIn(page, 'admin');
  await page.goto('/locks');
  await live(page);
  const row = page.locator('tr[data-lock="e2e-maintenance"]');
  await expect(row).toBeVisible();
  await expect(row.locator('td').nth(3)).toHaveText(fence);
  const left = row.locator('td').nth(2);
  const first = await left.textContent();
  await expect(left).not.toHaveText(first!, { timeout: 3000 });
  await page.screenshot({ path: 'output/locks.png', fullPage: true });
  await row.getByRole('button', { name: 'Force release…' }).click();
  const typed = row.getByLabel('Type the lock name to confirm');
  await typed.fill('e2e-maintenance');
  // Live samples keep arriving while the admin confirms: the form and what was
  // typed survive them (they once rebuilt the row and lost both).
  const before = await left.textContent();
  await expect(left).not.toHaveText(before!, { timeout: 3000 });
  await expect(typed).toHaveValue('e2e-maintenance');
  await row.getByRole('button', { name: 'Confirm force release' }).click();
  await expect(page.getByRole('status').filter({ hasText: 'Lock e2e-maintenance released' })).toBeVisible();
  await expect(row).toHaveCount(0, { timeout: 3000 });
  await page.goto('/audit');
  await expect(page.locator('tr[data-action="force_release_lock"]').first()).toContainText('e2e-maintenance');
  await page.screenshot({ path: 'output/audit.png', fullPage: true });
});

test('the warm-up progress bar reaches 100%', async ({ page }) => {
  await signIn(page, 'admin');
  await page.goto('/operations');
  await live(page);
  await page.getByRole('button', { name: 'Run a warm-up' }).click();
  const bar = page.getByRole('progressbar', { name: 'Warm-up progress' }).first();
  await expect(bar).toHaveAttribute('aria-valuenow', '100', { timeout: 5000 });
  await expect(page.locator('.job.finished').first()).toContainText('6 SKUs');
  await page.screenshot({ path: 'output/operations.png', fullPage: true });
});

test('an admin checks the deployment from the operations page', async ({ page }) => {
  await signIn(page, 'admin');
  await page.goto('/operations');
  await live(page);
  await page.getByRole('button', { name: 'Check the deployment' }).click();
  const checks = page.locator('.deployment');
  await expect(checks).toBeVisible({ timeout: 10000 });
  // The test Redis never evicts and shares this host's clock.
  await expect(checks.locator('tr', { hasText: 'redis eviction policy' })).toHaveAttribute('data-level', 'pass');
  await expect(checks.locator('tr', { hasText: 'clock skew' })).toHaveAttribute('data-level', 'pass');
  // It keeps nothing on disk: persistence warns, and so does the report.
  await expect(checks.locator('tr', { hasText: 'redis persistence' })).toHaveAttribute('data-level', 'warn');
  await expect(checks).toHaveAttribute('data-worst', /warn|fail/);
  await page.screenshot({ path: 'output/operations-checks.png', fullPage: true });
});

test('a shopper holds, watches the countdown and pays in the demo shop; the overview shows the sale', async ({ page, context }) => {
  await signIn(page, 'admin');
  await page.goto('/');
  await live(page);
  const sold = cell(page, 'DROP-004', 'sold');
  const before = number(await sold.textContent());
  const shop = await context.newPage();
  await shop.goto('/demo/shop');
  await shop.locator('button.hold[data-sku="DROP-004"]').click();
  const held = shop.locator('#cart li[data-state="held"]');
  await expect(held).toContainText('DROP-004');
  const left = held.locator('.left');
  await expect(left).toHaveText(/held for [12]:\d\d/);
  const first = (await left.textContent()) ?? '';
  await expect(left).not.toHaveText(first, { timeout: 3000 });
  await shop.screenshot({ path: 'output/demo-shop.png', fullPage: true });
  await held.getByRole('button', { name: 'Pay' }).click();
  await expect(shop.locator('#cart li[data-state="paid"]')).toContainText('Paid');
  await expect(sold).toHaveText(String(before + 1), { timeout: 5000 });
});

test('a merchandiser sets up a drop from a CSV, previews it, imports it and it sells', async ({ page, request }) => {
  await signIn(page, 'merchandiser');
  // Merchandising sets up drops; users, tokens and operations are not theirs.
  await expect(page.getByRole('link', { name: 'Drops' })).toBeVisible();
  await expect(page.getByRole('link', { name: 'Users & tokens' })).toHaveCount(0);
  await page.goto('/drops');
  await live(page);
  await expect(page.getByRole('heading', { level: 1 })).toHaveText('Drops');
  const csv = [
    'drop,drop_name,sku,product,variant,stock,per_buyer_limit',
    'e2e-spring,Spring E2E,E2E-1,Rain Jacket,Red / M,4,1',
    'e2e-spring,Spring E2E,E2E-2,Scarf,,many,',
  ].join('\n');
  // An uploaded file lands in the box, ready to preview.
  await page.getByLabel('Upload a file').setInputFiles({ name: 'spring.csv', mimeType: 'text/csv', buffer: Buffer.from(csv) });
  await expect(page.getByLabel('File contents')).toHaveValue(csv);
  await page.getByRole('button', { name: 'Preview' }).click();
  const refused = page.locator('[data-outcome="refused"]');
  await expect(refused).toContainText('line 3, column stock');
  await page.getByLabel('File contents').fill(csv.replace('many', '6'));
  await page.getByRole('button', { name: 'Preview' }).click();
  const preview = page.locator('[data-outcome="preview"]');
  await expect(preview).toContainText('importing would change 3 thing(s)');
  await expect(preview).toContainText('add new SKU E2E-1 with 4 unit(s)');
  // Nothing was written by the preview.
  let stock = await request.get('/api/v1/stock/E2E-1', { headers: { Authorization: `Bearer ${token}` } });
  expect(stock.status()).toBe(503);
  await page.getByLabel('Reason (for the audit log)').fill('spring set-up');
  await page.getByRole('button', { name: 'Import' }).click();
  await expect(page.locator('[data-outcome="imported"]')).toContainText('2 counter(s) created');
  stock = await request.get('/api/v1/stock/E2E-1', { headers: { Authorization: `Bearer ${token}` } });
  expect(stock.status()).toBe(200);
  expect((await stock.json()).available).toBe(4);
  const sold = await reserve(request, 'e2e-spring-1', 'E2E-1', 1);
  const paid = await request.post(`/api/v1/reservations/${sold}/confirm`, { headers: { Authorization: `Bearer ${token}` } });
  expect(paid.status(), await paid.text()).toBe(200);
  // Armed: its counters are there and carry its limits.
  await page.getByLabel('Drop to arm').fill('e2e-spring');
  await page.getByRole('button', { name: 'Arm' }).click();
  await expect(page.locator('table.readiness tr', { hasText: 'counters warmed' })).toHaveAttribute('data-ok', 'true');
  await expect(page.locator('table.readiness tr', { hasText: 'schedule and limits in the counters' })).toHaveAttribute('data-ok', 'true');
  // Exported, it comes back unchanged.
  await page.getByLabel('Drop code').fill('e2e-spring');
  await page.getByRole('button', { name: 'Export' }).click();
  await expect(page.getByLabel('Exported drop file')).toHaveValue(/E2E-2,Scarf,,Scarf,6/);
  await page.getByRole('button', { name: 'Edit it above' }).click();
  await page.getByRole('button', { name: 'Import' }).click();
  await expect(page.locator('[data-outcome="imported"]')).toContainText('nothing to change');
  // Its report lists every SKU.
  await page.getByLabel('Drop to report on').fill('e2e-spring');
  await page.getByRole('button', { name: 'Show report' }).click();
  await expect(page.locator('table.report tr[data-sku]')).toHaveCount(2);
  // The sale shows once the write-behind has recorded it (within moments).
  await expect.poll(async () => {
    await page.getByRole('button', { name: 'Show report' }).click();
    return page.locator('table.report tr[data-sku="E2E-1"] td[data-field="units_sold"]').textContent();
  }, { timeout: 10000 }).toBe('1');
  await expect(page.getByRole('link', { name: 'Download CSV' })).toHaveAttribute('download', 'e2e-spring-report.csv');
  // Lowering the stock below what is sold is warned of before it is imported.
  await page.getByLabel('File contents').fill(csv.replace('many', '6').replace('Red / M,4,1', 'Red / M,0,1'));
  await page.getByRole('button', { name: 'Preview' }).click();
  await expect(page.locator('[data-outcome="preview"] ul.warnings')).toContainText(
    'Warning: E2E-1: a stock of 0 leaves 1 of the 1 unit(s) already sold without stock');
  await page.screenshot({ path: 'output/drops.png', fullPage: true });
  // A merchandiser cannot release holds.
  await page.goto('/sku/E2E-1');
  await live(page);
  await expect(page.getByRole('button', { name: /Release/ })).toHaveCount(0);
});

test('a drop set up on the dashboard opens at its start: the badge counts down and flips, and the report matches the ledger', async ({ page, request }) => {
  test.setTimeout(60_000);
  await signIn(page, 'merchandiser');
  await page.goto('/drops');
  await live(page);
  const start = new Date(Date.now() + 15_000).toISOString();
  await page.getByLabel('File contents').fill([
    'drop,drop_name,starts_at,sku,product,stock',
    `e2e-timed,Timed E2E,${start},TIMED-1,Tote,5`,
    `e2e-timed,Timed E2E,${start},TIMED-2,Mug,3`,
  ].join('\n'));
  await page.getByRole('button', { name: 'Import' }).click();
  await expect(page.locator('[data-outcome="imported"]')).toContainText('2 counter(s) created');
  // A shop page with a badge for the new SKU: it counts down, then flips to
  // live stock at the start, without a reload.
  const shop = await page.context().newPage();
  await shop.goto('/demo/shop');
  await shop.evaluate(() => {
    const el = document.createElement('holdfast-stock');
    el.id = 'timed';
    el.setAttribute('sku', 'TIMED-1');
    document.body.append(el);
  });
  await expect(shop.locator('#timed')).toHaveText(/^Starts in \d+ s$/);
  const early = await request.post('/api/v1/reservations', {
    headers: { Authorization: `Bearer ${token}`, 'Idempotency-Key': 'timed-early' },
    data: { sku: 'TIMED-1', qty: 1 },
  });
  expect((await early.json()).code).toBe('not_started');
  // 5 units, at the default low-stock threshold (5): live stock reads low.
  await expect(shop.locator('#timed')).toHaveText('Only 5 left', { timeout: 25_000 });
  // Bought through the API once open.
  const id = await reserve(request, 'timed-1', 'TIMED-1', 2);
  const paid = await request.post(`/api/v1/reservations/${id}/confirm`, { headers: { Authorization: `Bearer ${token}` } });
  expect(paid.status()).toBe(200);
  // The report (written behind within moments) and its CSV agree with the ledger.
  await expect.poll(async () => {
    const r = await request.get('/api/v1/drops/e2e-timed/report', { headers: { Authorization: `Bearer ${token}` } });
    return (await r.json()).skus[0].units_sold;
  }, { timeout: 10_000 }).toBe(2);
  const csv = await (await request.get('/api/v1/drops/e2e-timed/report?format=csv', { headers: { Authorization: `Bearer ${token}` } })).text();
  const row = csv.split('\n').find((l) => l.startsWith('TIMED-1,'))!.split(',');
  const ledger = execFileSync('psql', [process.env.DATABASE_URL!, '-tAc',
    "SELECT -sum(qty) FROM ledger WHERE sku = 'TIMED-1' AND kind = 'sale'"]).toString().trim();
  expect(row[3]).toBe(ledger);
  await page.goto('/report?drop=e2e-timed');
  await live(page);
  await expect(page.locator('tr[data-sku="TIMED-1"] td[data-field="units_sold"]')).toHaveText('2');
});

test('a merchandiser creates a drop in the form; problems show next to their fields', async ({ page, request }) => {
  await signIn(page, 'merchandiser');
  await page.goto('/drops');
  await live(page);
  const form = page.locator('.drop-form');
  await form.locator('input[name="code"]').fill('e2e-form');
  await form.locator('input[name="name"]').fill('Form Drop');
  await page.getByLabel('SKU, row 1').fill('FORM-1');
  await page.getByLabel('Product, row 1').fill('Beanie');
  await page.getByLabel('Stock, row 1').fill('-3');
  await page.getByRole('button', { name: 'Add a SKU' }).click();
  await page.getByLabel('SKU, row 2').fill('FORM-2');
  await page.getByLabel('Product, row 2').fill('Gloves');
  await page.getByLabel('Stock, row 2').fill('8');
  await page.getByRole('button', { name: 'Save' }).click();
  await expect(page.locator('[data-form="refused"]')).toBeVisible();
  await expect(page.locator('[data-problem="skus[0].stock"]')).toContainText('a whole number from 0');
  await page.getByLabel('Stock, row 1').fill('5');
  await page.getByRole('button', { name: 'Save' }).click();
  await expect(page.locator('[data-form="saved"]')).toContainText('Drop e2e-form: saved');
  const stock = await request.get('/api/v1/stock/FORM-2', { headers: { Authorization: `Bearer ${token}` } });
  expect((await stock.json()).available).toBe(8);
  // Loaded back, edited: more stock, saved.
  await page.reload();
  await live(page);
  await page.getByLabel('Drop to edit').fill('e2e-form');
  await page.getByRole('button', { name: 'Load', exact: true }).click();
  await expect(page.getByLabel('Stock, row 2')).toHaveValue('8');
  await page.getByLabel('Stock, row 2').fill('10');
  await page.getByRole('button', { name: 'Save' }).click();
  await expect(page.locator('[data-form="saved"]')).toContainText('saved, 1 change(s)');
  await expect.poll(async () => {
    const r = await request.get('/api/v1/stock/FORM-2', { headers: { Authorization: `Bearer ${token}` } });
    return (await r.json()).available;
  }).toBe(10);
});

test('the wall view shows a drop large, without navigation, and follows a sale live; the report prints on its own page', async ({ page, request }) => {
  await signIn(page, 'viewer');
  await page.goto('/wall?drop=winter-launch');
  await live(page);
  await expect(page.getByRole('heading', { level: 1 })).toHaveText('Winter Launch Drop');
  await expect(page.locator('.topbar')).toBeHidden();
  await expect(page.locator('[data-clock="drop"]')).toContainText(/Open|Starts in|Ended/);
  const available = page.locator('.wall-sku[data-sku="DROP-004"] [data-field="available"]');
  const before = number(await available.textContent());
  await reserve(request, 'wall-1', 'DROP-004', 1);
  await expect(available).toHaveText(String(before - 1), { timeout: 2000 });
  await page.screenshot({ path: 'output/wall.png', fullPage: true });
  // The report has a printable page of its own.
  await page.goto('/report?drop=winter-launch');
  await live(page);
  await expect(page.getByRole('heading', { level: 1 })).toHaveText('Report: Winter Launch Drop');
  await expect(page.locator('table.report tr[data-sku]')).toHaveCount(6);
  await expect(page.locator('figure.timeline svg')).toBeVisible();
});

test('every other page renders for an admin', async ({ page }) => {
  await signIn(page, 'admin');
  for (const [path, heading] of [
    ['/reservations?q=buyer-overview-1', 'Reservations'],
    ['/ingestion', 'Ingestion'],
    ['/reserve', 'Reserve by hand'],
    ['/admin', 'Users'],
  ]) {
    await page.goto(path);
    await live(page);
    await expect(page.getByRole('heading', { level: 1 }).first()).toHaveText(heading);
    await page.screenshot({ path: `output/${path.slice(1).split('?')[0]}.png`, fullPage: true });
  }
  await page.goto('/reservations?q=buyer-overview-1');
  await expect(page.locator('tr[data-reservation]')).toHaveCount(1);
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto('/');
  await live(page);
  await page.screenshot({ path: 'output/overview-phone.png', fullPage: true });
});

test('a drop of 10,000 SKUs shows a page of them at a time, counts them all, and stays live', async ({ page, request }) => {
  test.setTimeout(180_000);
  // The drop comes from a PIM through the API (a catalog token made with the CLI).
  const catalog = execFileSync(process.env.HOLDFAST_BIN!, ['token', 'create', '--name', 'e2e-catalog', '--scopes', 'catalog'], { env: process.env, stdio: ['ignore', 'pipe', 'ignore'] })
    .toString().split('\n')[1].trim();
  const code = (i: number) => `BIG-${String(i).padStart(5, '0')}`;
  const lines = ['drop,drop_name,sku,product,stock'];
  for (let i = 0; i < 10_000; i++) lines.push(`e2e-big,Big E2E,${code(i)},Product ${Math.floor(i / 50)},5`);
  const imported = await request.put('/api/v1/drops/e2e-big', {
    headers: { Authorization: `Bearer ${catalog}`, 'Content-Type': 'text/csv' },
    data: lines.join('\n'),
    timeout: 120_000,
  });
  expect(imported.status(), await imported.text()).toBe(200);
  expect((await imported.json()).counters_warmed).toBe(10_000);

  await signIn(page, 'merchandiser');
  await page.goto('/?drop=e2e-big');
  await live(page);
  await expect(page.locator('tr[data-sku]')).toHaveCount(100);
  await expect(page.locator('.pager .page-of')).toHaveText('Page 1 of 100');
  await expect(page.locator('[data-total="available"]')).toHaveText('50,000');
  await expect(page.locator('.count')).toHaveText('Showing 10000 of 10000 SKUs');
  // The next page has the next hundred, and follows a sale live.
  await page.getByRole('button', { name: 'Next' }).click();
  await expect(page.locator('.pager .page-of')).toHaveText('Page 2 of 100');
  await expect(page.locator(`tr[data-sku="${code(150)}"]`)).toBeVisible();
  await expect(page.locator(`tr[data-sku="${code(0)}"]`)).toHaveCount(0);
  await reserve(request, 'big-150', code(150), 2);
  await expect(cell(page, code(150), 'available')).toHaveText('3', { timeout: 1000 });
  await expect(page.locator('[data-total="available"]')).toHaveText('49,998');
  // A sale on a page not shown counts in the totals at once.
  await reserve(request, 'big-9999', code(9999), 1);
  await expect(page.locator('[data-total="available"]')).toHaveText('49,997', { timeout: 1000 });
  // The filter searches every SKU, from the first page of what it keeps.
  await page.getByPlaceholder('SKU, title or product').fill('BIG-0999');
  await expect(page.locator('tr[data-sku]')).toHaveCount(10);
  await expect(page.locator('.count')).toHaveText('Showing 10 of 10000 SKUs');
  await expect(page.locator('.pager')).toHaveCount(0);
  await expect(cell(page, code(9999), 'available')).toHaveText('4');
  await page.screenshot({ path: 'output/overview-10000.png', fullPage: true });
});
