-- The write-behind writes a hold's row when the hold is made and rewrites it
-- when the hold ends, and rewrites each sold SKU's row in every batch. With
-- full pages (the default fill factor, 100) a rewritten row moves to another
-- page and every index of the table gets a new entry for it. Room left on each
-- page lets PostgreSQL keep the new version beside the old one without
-- touching the indexes (a heap-only update: none of these updates changes an
-- indexed column), and reclaim the old one as it goes. Applies to pages
-- written from now on; `VACUUM FULL` rewrites older ones.
ALTER TABLE holds SET (fillfactor = 70);
ALTER TABLE skus SET (fillfactor = 70);
