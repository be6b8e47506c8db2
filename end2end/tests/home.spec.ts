// The dashboard home: server-rendered SKUs, then controls that only work once the
// WASM bundle has hydrated the page.
import { test, expect } from '@playwright/test';

test('lists the demo drop and filters and sorts it after hydration', async ({ page }) => {
  const consoleErrors: string[] = [];
  page.on('console', (msg) => { if (msg.type() === 'error') consoleErrors.push(msg.text()); });

  await page.goto('/');
  await expect(page.getByRole('heading', { level: 1 })).toHaveText('Winter Launch Drop');
  const rows = page.locator('table.skus tbody tr');
  await expect(rows).toHaveCount(6);
  await expect(page.locator('tr[data-sku="DROP-001"]')).toContainText('2000');

  // Only the hydrated page flips this flag (effects never run on the server).
  await expect(page.locator('section.home')).toHaveAttribute('data-hydrated', 'true');

  await page.getByPlaceholder('SKU or title').fill('hoodie');
  await expect(rows).toHaveCount(3);
  await expect(page.locator('.count')).toHaveText('Showing 3 of 6 SKUs');

  await page.getByPlaceholder('SKU or title').fill('');
  await page.getByLabel('Sort by').selectOption('on_hand');
  await expect(rows.first()).toHaveAttribute('data-sku', 'DROP-001');
  await expect(rows.last()).toHaveAttribute('data-sku', 'DROP-006');

  await page.screenshot({ path: 'output/home.png', fullPage: true });
  expect(consoleErrors).toEqual([]);
});
