-- Whether a hold's line is ended once the row's events and a batch's are
-- put together: its latest end is at or after its latest hold, or no hold was
-- seen at all (an end recorded before its hold). The write-behind's upsert
-- of `holds` asks this for the ended time, the end's state and the oversold
-- units alike, so the rule is written once. A single-SELECT, IMMUTABLE, not
-- STRICT SQL function, so the planner inlines it into the statement.
CREATE FUNCTION hold_line_ended(
    row_held boolean, row_created timestamptz, row_ended timestamptz,
    new_held boolean, new_created timestamptz, new_ended timestamptz
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(
        greatest(row_ended, new_ended)
            >= greatest(CASE WHEN row_held THEN row_created END,
                        CASE WHEN new_held THEN new_created END),
        true)
$$;
