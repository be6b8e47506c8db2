-- What foreign keys cost the write-behind's inserts (BENCHMARKS.md, "Run of
-- 2026-12-04, 13:45 UTC"): ledger rows and order lines like a drop's, 40,000
-- per statement, into tables with and without the foreign keys that
-- migrations/0016 dropped, alternately, three rounds. In a scratch database:
--
--   psql -h 127.0.0.1 -U postgres -c 'CREATE DATABASE row_checks'
--   psql -h 127.0.0.1 -U postgres -d row_checks -f scripts/bench/row_checks.sql
--   psql -h 127.0.0.1 -U postgres -c 'DROP DATABASE row_checks'
\set ON_ERROR_STOP 1
SET client_min_messages = notice;
CREATE TABLE skus (sku text PRIMARY KEY);
INSERT INTO skus SELECT 'B-' || lpad(i::text, 6, '0') FROM generate_series(0, 19999) i;
CREATE TABLE orders (reservation_id text PRIMARY KEY);
INSERT INTO orders SELECT 'r-' || i FROM generate_series(0, 119999) i;
CREATE TABLE ledger_fk (id bigserial PRIMARY KEY, sku text NOT NULL REFERENCES skus,
    kind text, qty bigint, source text, event_id text, UNIQUE (source, event_id));
CREATE TABLE ledger_no (id bigserial PRIMARY KEY, sku text NOT NULL,
    kind text, qty bigint, source text, event_id text, UNIQUE (source, event_id));
CREATE TABLE lines_fk (reservation_id text NOT NULL REFERENCES orders,
    sku text NOT NULL REFERENCES skus, qty bigint, PRIMARY KEY (reservation_id, sku));
CREATE TABLE lines_no (reservation_id text NOT NULL, sku text NOT NULL, qty bigint,
    PRIMARY KEY (reservation_id, sku));
VACUUM ANALYZE;
DO $$
DECLARE
    t timestamptz;
    tbl text;
    ms numeric;
BEGIN
    FOR round IN 0..2 LOOP
        FOREACH tbl IN ARRAY ARRAY['ledger_fk', 'ledger_no', 'lines_fk', 'lines_no'] LOOP
            t := clock_timestamp();
            IF tbl LIKE 'ledger%' THEN
                EXECUTE format(
                    'INSERT INTO %I (sku, kind, qty, source, event_id)
                     SELECT s.sku, ''sale'', -1, ''checkout'', %L || i
                       FROM generate_series(0, 39999) i
                       JOIN skus s ON s.sku = ''B-'' || lpad((i %% 2000)::text, 6, ''0'')',
                    tbl, round);
            ELSE
                EXECUTE format(
                    'INSERT INTO %I (reservation_id, sku, qty)
                     SELECT ''r-'' || (i + %s), s.sku, 1
                       FROM generate_series(0, 39999) i
                       JOIN skus s ON s.sku = ''B-'' || lpad((i %% 2000)::text, 6, ''0'')',
                    tbl, round * 40000);
            END IF;
            ms := round(extract(epoch FROM clock_timestamp() - t)::numeric * 1000, 1);
            RAISE NOTICE 'round %: 40,000 rows into % in % ms (% us a row)',
                round + 1, tbl, ms, round(ms * 1000 / 40000, 1);
        END LOOP;
    END LOOP;
END $$;
