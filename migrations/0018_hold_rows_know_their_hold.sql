-- A hold's row is made of the line's latest hold and latest end seen by the
-- write-behind, whatever order their events arrive in. `held` says whether a
-- hold was seen: without one (its end recorded first) `created_at` is the
-- end's time standing in, and the hold's own time replaces it when the hold
-- arrives. Rows written before this count as held.
ALTER TABLE holds ADD COLUMN held boolean NOT NULL DEFAULT true;
