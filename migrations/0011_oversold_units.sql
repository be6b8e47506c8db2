-- Units of each hold line that were sold although a feed had removed them (an
-- oversell to refund or source), per SKU: a drop's report sums them as its
-- shortfalls. Lines recorded before this column get theirs from the oversell
-- remediation's reason, which names the first such line's units and SKU.
ALTER TABLE holds ADD COLUMN oversold_units bigint NOT NULL DEFAULT 0 CHECK (oversold_units >= 0);
UPDATE holds h
   SET oversold_units = substring(r.reason FROM '^([0-9]+) unit')::bigint
  FROM remediations r
 WHERE r.kind = 'oversold' AND r.reservation_id = h.reservation_id
   AND r.reason LIKE '% unit(s) of ' || h.sku || ' sold%';
