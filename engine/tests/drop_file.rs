//! A drop as a file: imported all or nothing (refused by line and column),
//! previewed by a dry run, exported and imported back unchanged, stock changes
//! applied once through the feed's delta path under open holds and recorded in
//! the ledger, and a change cut short by a Redis outage applied afterwards.

use holdfast_domain::sheet::{DropSheet, ImportReport};
use holdfast_domain::{ConfirmOutcome, ReserveOutcome, ReserveRequest};
use holdfast_engine::drop_file::{self, Format, ImportOptions, ImportOutcome};
use holdfast_engine::schedule::{self, DropSchedule, ScheduleOutcome};
use holdfast_engine::testkit::{TestRedis, backends};
use holdfast_engine::verify::{VerifyOptions, verify};
use holdfast_engine::{Backends, Engine};
use sqlx::PgPool;

const SPRING: &str = "\
drop,drop_name,sku,product,variant,stock,per_buyer_limit,low_stock_threshold
spring,Spring Drop,SP-1,Rain Jacket,Red / M,10,2,3
spring,Spring Drop,SP-2,\"Scarf, wool\",,5,,
";

fn options(dry_run: bool) -> ImportOptions<'static> {
    ImportOptions {
        actor: "test",
        reason: "test import",
        dry_run,
    }
}

async fn import_text(b: &Backends, text: &str, format: Format, dry_run: bool) -> ImportOutcome {
    let (sheet, lines) = match drop_file::parse(text, format) {
        Ok(read) => read,
        Err(problems) => return ImportOutcome::Refused(problems),
    };
    drop_file::import(&b.engine, &b.pg, &sheet, &lines, options(dry_run))
        .await
        .unwrap()
}

async fn imported(b: &Backends, text: &str) -> ImportReport {
    match import_text(b, text, Format::Csv, false).await {
        ImportOutcome::Done(report) => report,
        ImportOutcome::Refused(p) => panic!("refused: {p:?}"),
    }
}

fn kinds(report: &ImportReport) -> Vec<String> {
    report
        .changes
        .iter()
        .map(|c| format!("{}:{}", c.what, c.sku.clone().unwrap_or_default()))
        .collect()
}

async fn available(engine: &Engine, sku: &str) -> i64 {
    engine.figures(sku).await.unwrap().unwrap().available
}

async fn export(b: &Backends) -> DropSheet {
    drop_file::export(&b.pg, "spring").await.unwrap().unwrap()
}

async fn drain(b: &Backends, redis: &TestRedis) {
    holdfast_engine::testkit::drain_write_behind(b, &redis.url()).await;
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_csv_creates_a_drop_that_sells_and_comes_back_unchanged(pg: PgPool) {
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;

    let preview = match import_text(&b, SPRING, Format::Csv, true).await {
        ImportOutcome::Done(r) => r,
        other => panic!("{other:?}"),
    };
    assert!(preview.dry_run);
    assert_eq!(
        kinds(&preview),
        ["create_drop:", "add_sku:SP-1", "add_sku:SP-2"]
    );
    assert!(drop_file::export(&b.pg, "spring").await.unwrap().is_none());
    assert!(b.engine.figures("SP-1").await.unwrap().is_none());

    let report = imported(&b, SPRING).await;
    assert_eq!(kinds(&report), kinds(&preview));
    assert_eq!(report.counters_warmed, 2);
    assert_eq!(available(&b.engine, "SP-1").await, 10);
    assert_eq!(available(&b.engine, "SP-2").await, 5);
    // The file's per-buyer limit is in the counter.
    let over = |rid: &str| ReserveRequest::single(rid, "SP-1", 3).for_buyer("ann");
    assert!(matches!(
        b.engine.reserve(&over("r1")).await.unwrap(),
        ReserveOutcome::LimitExceeded { limit: 2, .. }
    ));

    // Export, then import: nothing changes, in either form.
    let sheet = export(&b).await;
    assert_eq!(sheet.name, "Spring Drop");
    assert_eq!(sheet.skus[1].product, "Scarf, wool");
    assert_eq!(
        sheet.skus[0].title.as_deref(),
        Some("Rain Jacket — Red / M")
    );
    for format in [Format::Csv, Format::Json] {
        let again = match import_text(&b, &drop_file::render(&sheet, format), format, false).await {
            ImportOutcome::Done(r) => r,
            other => panic!("{other:?}"),
        };
        assert!(again.changes.is_empty(), "{format:?}: {:?}", again.changes);
    }
    assert_eq!(export(&b).await, sheet);

    // An edit: one field, one limit, and a SKU left out stays in the drop.
    let edited = "\
drop,sku,product,variant,stock,per_buyer_limit,low_stock_threshold
spring,SP-1,Rain Jacket,Red / M,10,4,3
";
    let report = imported(&b, edited).await;
    assert_eq!(
        report
            .changes
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>(),
        ["SP-1 per_buyer_limit: 2 -> 4"]
    );
    assert_eq!(report.not_in_file, ["SP-2"]);
    // The new limit is live at once.
    assert!(matches!(
        b.engine.reserve(&over("r2")).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn stock_changes_under_open_holds_move_on_hand_once_through_the_delta_path(pg: PgPool) {
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    imported(&b, SPRING).await;
    // Four held, two of them paid.
    for (rid, qty) in [("h1", 2), ("h2", 2)] {
        let req = ReserveRequest::single(rid, "SP-2", qty);
        assert!(matches!(
            b.engine.reserve(&req).await.unwrap(),
            ReserveOutcome::Reserved { .. }
        ));
    }
    assert!(matches!(
        b.engine.confirm("h1").await.unwrap(),
        ConfirmOutcome::Confirmed
    ));
    assert_eq!(available(&b.engine, "SP-2").await, 1);

    // The same file again, after sales: nothing changes (no units come back).
    assert!(imported(&b, SPRING).await.changes.is_empty());
    assert_eq!(available(&b.engine, "SP-2").await, 1);

    // Five more for SP-2, then two fewer: each moves on hand by the difference,
    // around the open hold.
    let more = SPRING.replace("\"Scarf, wool\",,5", "\"Scarf, wool\",,10");
    let report = imported(&b, &more).await;
    assert_eq!(kinds(&report), ["stock:SP-2"]);
    assert_eq!(report.stock_changes_applied, 1);
    assert_eq!(available(&b.engine, "SP-2").await, 6);
    let fewer = SPRING.replace("\"Scarf, wool\",,5", "\"Scarf, wool\",,8");
    assert_eq!(imported(&b, &fewer).await.stock_changes_applied, 1);
    assert_eq!(available(&b.engine, "SP-2").await, 4);
    assert!(imported(&b, &fewer).await.changes.is_empty());
    assert_eq!(available(&b.engine, "SP-2").await, 4);

    // Lowering below what was sold and is held: no counter goes negative; the
    // units held beyond the stock are owed (paid back first by any that return).
    let none = SPRING.replace("\"Scarf, wool\",,5", "\"Scarf, wool\",,0");
    imported(&b, &none).await;
    let f = b.engine.figures("SP-2").await.unwrap().unwrap();
    assert_eq!(f.available, 0);
    assert!(f.reserved == 2 && f.owed == 4, "{f:?}");

    // Applied in Redis, the changes wait for the ledger; the write-behind
    // records each once, under its event id, and the next pass marks them.
    let waiting: i64 =
        sqlx::query_scalar("SELECT count(*) FROM stock_changes WHERE applied_at IS NULL")
            .fetch_one(&b.pg)
            .await
            .unwrap();
    assert_eq!(waiting, 3);
    drain(&b, &redis).await;
    assert_eq!(
        drop_file::apply_pending_stock(&b.engine, &b.pg)
            .await
            .unwrap(),
        0,
        "nothing is applied twice"
    );
    let moves: Vec<(String, i64)> = sqlx::query_as(
        "SELECT l.kind, l.qty FROM ledger l JOIN stock_changes c ON c.event_id = l.event_id
          WHERE l.source = 'import' ORDER BY c.created_at",
    )
    .fetch_all(&b.pg)
    .await
    .unwrap();
    assert_eq!(
        moves,
        [
            ("receipt".to_owned(), 5),
            ("adjustment".to_owned(), -2),
            ("adjustment".to_owned(), -8)
        ]
    );
    let (on_hand, pending): (i64, i64) = sqlx::query_as(
        "SELECT on_hand, (SELECT count(*) FROM stock_changes WHERE applied_at IS NULL)
           FROM skus WHERE sku = 'SP-2'",
    )
    .fetch_one(&b.pg)
    .await
    .unwrap();
    // 5 given, 2 sold, +5, -2, -8: the drop sold 2 more than it now has.
    assert_eq!((on_hand, pending), (5 - 2 + 5 - 2 - 8, 0));
    let report = verify(&b.engine, &b.pg, &VerifyOptions::default())
        .await
        .unwrap();
    assert!(report.passed(), "{report:?}");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_bad_file_is_refused_by_line_and_column_and_changes_nothing(pg: PgPool) {
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    let bad = "\
drop,sku,product,stock,per_buyer_limit,starts_at
spring,SP-1,Jacket,10,,
spring,bad sku,Jacket,10,,
spring,SP-3,,-4,0,
spring,SP-1,Jacket,1,,tomorrow
";
    let ImportOutcome::Refused(problems) = import_text(&b, bad, Format::Csv, false).await else {
        panic!("a bad file was imported");
    };
    let at: Vec<(Option<u64>, &str)> = problems
        .iter()
        .map(|p| (p.line, p.column.as_str()))
        .collect();
    assert_eq!(
        at,
        [
            (Some(2), "starts_at"),
            (Some(3), "sku"),
            (Some(4), "product"),
            (Some(4), "stock"),
            (Some(4), "per_buyer_limit"),
            (Some(5), "sku"),
        ],
        "{problems:#?}"
    );
    assert!(problems[5].message.contains("line 2"), "{}", problems[5]);
    // JSON names paths.
    let json = r#"{"code": "spring", "skus": [{"sku": "OK-1", "product": "P", "stock": 1},
                   {"sku": "OK-2", "product": "P", "stock": -1}]}"#;
    let ImportOutcome::Refused(problems) = import_text(&b, json, Format::Json, false).await else {
        panic!("a bad file was imported");
    };
    assert_eq!(problems[0].column, "skus[1].stock");
    assert_eq!(problems[0].line, None);
    let drops: i64 = sqlx::query_scalar("SELECT count(*) FROM drops")
        .fetch_one(&b.pg)
        .await
        .unwrap();
    assert_eq!(drops, 0);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn an_import_failing_half_way_changes_nothing(pg: PgPool) {
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    imported(&b, SPRING).await;
    let before = export(&b).await;
    // PostgreSQL refuses the third SKU's drop row, after the drop and the
    // SKUs were written in the same transaction.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_sp3() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN IF NEW.sku = 'SP-3' THEN RAISE EXCEPTION 'refused for the test'; END IF;
               RETURN NEW; END $$;
         CREATE TRIGGER refuse_sp3 BEFORE INSERT ON drop_skus
             FOR EACH ROW EXECUTE FUNCTION refuse_sp3();",
    )
    .execute(&b.pg)
    .await
    .unwrap();
    let changed = "\
drop,drop_name,sku,product,stock
spring,Renamed,SP-1,Jacket,99
spring,Renamed,SP-2,Scarf,1
spring,Renamed,SP-3,Hat,7
";
    let (sheet, lines) = drop_file::parse(changed, Format::Csv).unwrap();
    let failed = drop_file::import(&b.engine, &b.pg, &sheet, &lines, options(false)).await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(export(&b).await, before);
    let (skus, changes): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM skus), (SELECT count(*) FROM stock_changes)")
            .fetch_one(&b.pg)
            .await
            .unwrap();
    assert_eq!((skus, changes), (2, 0));
    assert_eq!(available(&b.engine, "SP-1").await, 10);
    assert!(b.engine.figures("SP-3").await.unwrap().is_none());
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_stock_change_cut_short_by_a_redis_outage_is_applied_afterwards(pg: PgPool) {
    let mut redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    imported(&b, SPRING).await;
    redis.kill();
    let more = SPRING.replace("Red / M,10", "Red / M,25");
    let (sheet, lines) = drop_file::parse(&more, Format::Csv).unwrap();
    let cut = drop_file::import(&b.engine, &b.pg, &sheet, &lines, options(false)).await;
    // Saved, and said so: the live side follows by itself.
    let Err(e @ holdfast_engine::EngineError::SavedNotLive(_)) = cut else {
        panic!("Redis is down: {cut:?}");
    };
    assert!(e.to_string().contains("saved in PostgreSQL"), "{e}");
    // Recorded, pending.
    let pending: i64 =
        sqlx::query_scalar("SELECT count(*) FROM stock_changes WHERE applied_at IS NULL")
            .fetch_one(&b.pg)
            .await
            .unwrap();
    assert_eq!(pending, 1);
    // Redis comes back empty (it kept nothing): the pending change is applied
    // over a counter warmed from PostgreSQL, which does not count it yet.
    redis.restart();
    let mut applied = Err(None);
    for _ in 0..50 {
        match drop_file::apply_pending_stock(&b.engine, &b.pg).await {
            Ok(n) => {
                applied = Ok(n);
                break;
            }
            Err(e) => applied = Err(Some(e.to_string())),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(applied, Ok(1));
    assert_eq!(available(&b.engine, "SP-1").await, 25);
    assert_eq!(
        drop_file::apply_pending_stock(&b.engine, &b.pg)
            .await
            .unwrap(),
        0
    );
    assert_eq!(available(&b.engine, "SP-1").await, 25);
    // And the file, sent again, changes nothing.
    assert!(imported(&b, &more).await.changes.is_empty());
    drain(&b, &redis).await;
    let on_hand: i64 = sqlx::query_scalar("SELECT on_hand FROM skus WHERE sku = 'SP-1'")
        .fetch_one(&b.pg)
        .await
        .unwrap();
    assert_eq!(on_hand, 25);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_file_schedule_is_live_at_once(pg: PgPool) {
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    imported(&b, SPRING).await;
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let mut sheet = export(&b).await;
    sheet.starts_at = Some(later.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    let text = drop_file::render(&sheet, Format::Json);
    let ImportOutcome::Done(report) = import_text(&b, &text, Format::Json, false).await else {
        panic!("refused");
    };
    assert_eq!(kinds(&report), ["drop_field:"]);
    let req = ReserveRequest::single("early", "SP-2", 1);
    assert!(matches!(
        b.engine.reserve(&req).await.unwrap(),
        ReserveOutcome::NotStarted { .. }
    ));
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn arming_warms_and_fixes_the_counters_and_says_what_is_not_ready(pg: PgPool) {
    use holdfast_engine::arm::{self, ArmOptions};
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    imported(&b, SPRING).await;
    // A counter lost, another's limit changed by hand.
    let mut conn = redis.connection().await;
    let keys = b.engine.keyspace();
    redis::cmd("DEL")
        .arg(keys.sku("SP-2"))
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    redis::cmd("HSET")
        .arg(keys.sku("SP-1"))
        .arg("limit")
        .arg(0)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let line = |r: &holdfast_domain::readiness::Readiness, name: &str| {
        r.lines
            .iter()
            .find(|l| l.name == name)
            .unwrap_or_else(|| panic!("no line {name}: {r:?}"))
            .clone()
    };
    let before = arm::readiness(&b.engine, &b.pg, "spring")
        .await
        .unwrap()
        .unwrap();
    assert!(!before.ready());
    let warmed = line(&before, "counters warmed");
    assert!(!warmed.ok && warmed.finding.contains("SP-2"), "{warmed:?}");
    let settings = line(&before, "schedule and limits in the counters");
    assert!(
        !settings.ok && settings.finding.contains("SP-1"),
        "{settings:?}"
    );
    // Reading changed nothing.
    assert!(b.engine.figures("SP-2").await.unwrap().is_none());
    // A stock change that never reached Redis (it refused writes, say) is
    // not ready, and the truth check says so too.
    sqlx::query(
        "INSERT INTO stock_changes (event_id, sku, delta, actor, reason, created_at)
         VALUES ('import:stuck', 'SP-1', 1, 'test', 'test', now() - interval '1 minute')",
    )
    .execute(&b.pg)
    .await
    .unwrap();
    let stuck = arm::readiness(&b.engine, &b.pg, "spring")
        .await
        .unwrap()
        .unwrap();
    assert!(!line(&stuck, "stock changes applied").ok, "{stuck:?}");
    let checked = verify(&b.engine, &b.pg, &VerifyOptions::default())
        .await
        .unwrap();
    assert!(
        checked
            .checks
            .iter()
            .any(|c| c.name == "every imported stock change is applied" && !c.passed),
        "{checked:?}"
    );

    drain(&b, &redis).await;
    let armed = arm::arm(&b.engine, &b.pg, "spring", ArmOptions { pause_feeds: true })
        .await
        .unwrap()
        .unwrap();
    // Once the write-behind has recorded the change, the next pass marks it.
    drain(&b, &redis).await;
    drop_file::apply_pending_stock(&b.engine, &b.pg)
        .await
        .unwrap();
    let after = arm::readiness(&b.engine, &b.pg, "spring")
        .await
        .unwrap()
        .unwrap();
    assert!(after.ready(), "{after:#?}\narmed: {armed:#?}");
    assert!(
        armed
            .armed
            .iter()
            .any(|a| a.contains("applied 1 waiting stock change")),
        "{armed:?}"
    );
    assert_eq!(available(&b.engine, "SP-1").await, 11);
    assert!(
        armed
            .armed
            .iter()
            .any(|a| a.contains("paused the feeds lane"))
    );
    assert!(line(&after, "feeds lane").finding.starts_with("paused"));
    assert_eq!(available(&b.engine, "SP-2").await, 5);
    let over = ReserveRequest::single("r-arm", "SP-1", 3).for_buyer("ann");
    assert!(matches!(
        b.engine.reserve(&over).await.unwrap(),
        ReserveOutcome::LimitExceeded { limit: 2, .. }
    ));
    assert!(
        arm::readiness(&b.engine, &b.pg, "nope")
            .await
            .unwrap()
            .is_none()
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_report_counts_sales_and_how_every_hold_ended(pg: PgPool) {
    use holdfast_domain::HoldState;
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    imported(&b, &SPRING.replace("Red / M,10", "Red / M,4")).await;
    let hold = |rid: &str, qty: i64, ttl: Option<u64>| {
        let mut req = ReserveRequest::single(rid, "SP-1", qty).for_buyer(format!("buyer-{rid}"));
        req.ttl_ms = ttl;
        req
    };
    for (rid, qty, ttl) in [("h1", 2, None), ("h2", 1, None), ("h3", 1, Some(1_000))] {
        let outcome = b.engine.reserve(&hold(rid, qty, ttl)).await.unwrap();
        assert!(
            matches!(outcome, ReserveOutcome::Reserved { .. }),
            "{rid}: {outcome:?}"
        );
    }
    b.engine.confirm("h1").await.unwrap();
    // Support releases h2 (the dashboard writes the audit entry it is counted by).
    b.engine.release("h2").await.unwrap();
    holdfast_engine::audit::record(
        &b.pg,
        "support",
        "release_hold",
        "h2",
        serde_json::json!({}),
    )
    .await
    .unwrap();
    // h3 expires, and its payment arrives late.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    b.engine.reap_once(100).await.unwrap();
    b.engine
        .note_late_payment("h3", HoldState::Expired)
        .await
        .unwrap();
    // The last two units.
    assert!(matches!(
        b.engine.reserve(&hold("h4", 2, None)).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    b.engine.confirm("h4").await.unwrap();
    drain(&b, &redis).await;

    let report = holdfast_engine::report::drop_report(&b.pg, "spring")
        .await
        .unwrap()
        .unwrap();
    let sp1 = &report.skus[0];
    assert_eq!(sp1.sku, "SP-1");
    assert_eq!(
        (sp1.stock, sp1.units_sold, sp1.holds, sp1.confirmed),
        (4, 4, 4, 2)
    );
    assert_eq!(
        (
            sp1.released_by_shoppers,
            sp1.released_by_support,
            sp1.expired,
            sp1.open,
            sp1.late_payments
        ),
        (0, 1, 1, 0, 1),
        "{sp1:?}"
    );
    assert!(sp1.sold_out_after_secs.is_some_and(|s| s >= 0.0), "{sp1:?}");
    assert!(sp1.peak_holds_per_second >= 1);
    // The timeline: every hold in its second, the units sold with them.
    assert_eq!(report.timeline_bucket_secs, 1);
    let holds: i64 = report.timeline.iter().map(|p| p.holds).sum();
    let sold: i64 = report.timeline.iter().map(|p| p.units_sold).sum();
    assert_eq!((holds, sold), (4, 4), "{:?}", report.timeline);
    assert!(report.timeline.windows(2).all(|w| w[0].at_ms < w[1].at_ms));
    // SP-2 sold nothing: zeros, not missing.
    assert_eq!(
        (report.skus[1].holds, report.skus[1].sold_out_after_secs),
        (0, None)
    );
    // The CSV says the same, and matches the ledger.
    let csv = report.to_csv();
    assert!(csv.starts_with("sku,title,stock,units_sold,"), "{csv}");
    assert!(
        csv.lines()
            .nth(1)
            .unwrap()
            .starts_with("SP-1,Rain Jacket — Red / M,4,4,4,2,0,1,1,0,1,"),
        "{csv}"
    );
    let ledger: i64 = sqlx::query_scalar(
        "SELECT coalesce(-sum(qty), 0)::bigint FROM ledger WHERE sku = 'SP-1' AND kind = 'sale'",
    )
    .fetch_one(&b.pg)
    .await
    .unwrap();
    assert_eq!(ledger, sp1.units_sold);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_stock_below_what_is_sold_is_warned_of_in_the_preview(pg: PgPool) {
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    imported(&b, SPRING).await;
    let req = ReserveRequest::single("sold-6", "SP-1", 2).for_buyer("ann");
    let outcome = b.engine.reserve(&req).await.unwrap();
    assert!(
        matches!(outcome, ReserveOutcome::Reserved { .. }),
        "{outcome:?}"
    );
    assert_eq!(
        b.engine.confirm("sold-6").await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    drain(&b, &redis).await;
    let b = &b;
    let preview = |stock: &str| {
        let text = SPRING.replace("Red / M,10", &format!("Red / M,{stock}"));
        async move {
            match import_text(b, &text, Format::Csv, true).await {
                ImportOutcome::Done(report) => report.warnings,
                ImportOutcome::Refused(p) => panic!("refused: {p:?}"),
            }
        }
    };
    // 2 sold of 10: lowering to 2 is fine, to 1 leaves a sold unit without stock.
    assert_eq!(preview("2").await, Vec::<String>::new());
    let warnings = preview("1").await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("SP-1: a stock of 1 leaves 1 of the 2 unit(s) already sold"),
        "{warnings:?}"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_report_counts_shortfalls_in_units(pg: PgPool) {
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    imported(&b, &SPRING.replace("Red / M,10,2", "Red / M,5,")).await;
    for (rid, qty) in [("s1", 3), ("s2", 1)] {
        let req = ReserveRequest::single(rid, "SP-1", qty);
        let outcome = b.engine.reserve(&req).await.unwrap();
        assert!(
            matches!(outcome, ReserveOutcome::Reserved { .. }),
            "{outcome:?}"
        );
    }
    // The supplier counts none on the shelf: all four held units are owed,
    // and both holds are paid anyway.
    b.engine
        .apply_snapshot("SP-1", 0, 1, "erp", "count-1")
        .await
        .unwrap();
    for rid in ["s1", "s2"] {
        assert_eq!(
            b.engine.confirm(rid).await.unwrap(),
            ConfirmOutcome::Confirmed
        );
    }
    drain(&b, &redis).await;
    let report = holdfast_engine::report::drop_report(&b.pg, "spring")
        .await
        .unwrap()
        .unwrap();
    let sp1 = &report.skus[0];
    // Four units short over two paid holds: the report counts units.
    assert_eq!((sp1.units_sold, sp1.shortfalls), (4, 4), "{sp1:?}");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_change_redis_took_then_lost_before_the_ledger_is_applied_again(pg: PgPool) {
    let mut redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    imported(&b, SPRING).await;
    drain(&b, &redis).await;
    // +15 for SP-1: Redis takes it, then loses everything before the
    // write-behind records it.
    let more = SPRING.replace("Red / M,10", "Red / M,25");
    assert_eq!(imported(&b, &more).await.stock_changes_applied, 1);
    assert_eq!(available(&b.engine, "SP-1").await, 25);
    redis.restart();
    // Not in the ledger, so still waiting: the next pass warms the counter
    // from PostgreSQL (10) and applies the change again.
    let mut applied = None;
    for _ in 0..50 {
        if let Ok(n) = drop_file::apply_pending_stock(&b.engine, &b.pg).await {
            applied = Some(n);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(applied, Some(1));
    assert_eq!(available(&b.engine, "SP-1").await, 25);
    drain(&b, &redis).await;
    assert_eq!(
        drop_file::apply_pending_stock(&b.engine, &b.pg)
            .await
            .unwrap(),
        0
    );
    let (on_hand, waiting): (i64, i64) = sqlx::query_as(
        "SELECT on_hand, (SELECT count(*) FROM stock_changes WHERE applied_at IS NULL)
           FROM skus WHERE sku = 'SP-1'",
    )
    .fetch_one(&b.pg)
    .await
    .unwrap();
    assert_eq!((on_hand, waiting), (25, 0));
}

/// Drop `code` of 300 SKUs (`<prefix>-000`…) with `stock` each, starting at
/// `starts` (empty: unscheduled), read from CSV.
fn three_hundred(code: &str, prefix: &str, stock: i64, starts: &str) -> (DropSheet, Vec<u64>) {
    let mut text = "drop,starts_at,sku,product,stock\n".to_owned();
    for i in 0..300 {
        text.push_str(&format!("{code},{starts},{prefix}-{i:03},P,{stock}\n"));
    }
    drop_file::parse(&text, Format::Csv).unwrap()
}

/// Imports `file` in a task of its own.
fn spawn_import(
    b: &Backends,
    (sheet, lines): (DropSheet, Vec<u64>),
) -> tokio::task::JoinHandle<ImportOutcome> {
    let (engine, pg) = (b.engine.clone(), b.pg.clone());
    tokio::spawn(async move {
        drop_file::import(&engine, &pg, &sheet, &lines, options(false))
            .await
            .unwrap()
    })
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn imports_of_two_drops_sharing_new_skus_at_once_stay_consistent(pg: PgPool) {
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    let file = |code: &str, stock: i64, starts: &str| three_hundred(code, "SH", stock, starts);
    let run = |file| spawn_import(&b, file);
    let (a, c) = tokio::join!(run(file("drop-a", 100, "")), run(file("drop-b", 50, "")));
    assert!(matches!(a.unwrap(), ImportOutcome::Done(_)));
    assert!(matches!(c.unwrap(), ImportOutcome::Done(_)));
    drop_file::apply_pending_stock(&b.engine, &b.pg)
        .await
        .unwrap();
    drain(&b, &redis).await;
    // Whichever came second changed the stock the first had given: every SKU
    // has on hand what it was last given, in PostgreSQL and in Redis.
    let rows: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT sku, on_hand, stock_declared FROM skus ORDER BY sku")
            .fetch_all(&b.pg)
            .await
            .unwrap();
    assert_eq!(rows.len(), 300);
    for (sku, on_hand, declared) in &rows {
        assert_eq!(on_hand, declared, "{sku}");
        assert_eq!(available(&b.engine, sku).await, *declared, "{sku}");
    }
    let report = verify(&b.engine, &b.pg, &VerifyOptions::default())
        .await
        .unwrap();
    assert!(report.passed(), "{report:?}");

    // Two schedules for drops sharing SKUs, at once: one wins, the other is refused.
    let (x, y) = tokio::join!(
        run(file("drop-a", 100, "2030-03-01T00:00:00Z")),
        run(file("drop-b", 50, "2030-04-01T00:00:00Z"))
    );
    let refused = [x.unwrap(), y.unwrap()]
        .iter()
        .filter(|o| matches!(o, ImportOutcome::Refused(_)))
        .count();
    assert_eq!(refused, 1);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_schedule_racing_an_import_of_a_drop_sharing_its_skus_leaves_one_scheduled(pg: PgPool) {
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    let file = |code: &str, starts: &str| three_hundred(code, "RC", 10, starts);
    let import = |file| spawn_import(&b, file);
    let schedule = |starts: Option<&str>| {
        let (engine, pg) = (b.engine.clone(), b.pg.clone());
        let when = DropSchedule {
            starts_at: starts.map(|s| s.parse().unwrap()),
            ends_at: None,
        };
        tokio::spawn(async move {
            schedule::schedule_drop(&engine, &pg, "race-a", when)
                .await
                .unwrap()
        })
    };
    import(file("race-a", "")).await.unwrap();
    import(file("race-b", "")).await.unwrap();
    for round in 0..6 {
        // Both unscheduled, then drop A scheduled by hand while drop B's file
        // schedules it: exactly one of the two may win.
        schedule(None).await.unwrap();
        assert!(matches!(
            import(file("race-b", "")).await.unwrap(),
            ImportOutcome::Done(_)
        ));
        let (a, b_file) = tokio::join!(
            schedule(Some("2030-03-01T00:00:00Z")),
            import(file("race-b", "2030-04-01T00:00:00Z"))
        );
        let a_won = matches!(a.unwrap(), ScheduleOutcome::Scheduled { .. });
        let b_won = matches!(b_file.unwrap(), ImportOutcome::Done(_));
        assert!(a_won != b_won, "round {round}: A {a_won}, B {b_won}");
        let twice: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (
                 SELECT ds.sku FROM drop_skus ds JOIN drops d ON d.code = ds.drop_code
                  WHERE d.starts_at IS NOT NULL OR d.ends_at IS NOT NULL
                  GROUP BY ds.sku HAVING count(*) > 1) t",
        )
        .fetch_one(&b.pg)
        .await
        .unwrap();
        assert_eq!(twice, 0, "round {round}: SKUs in two scheduled drops");
    }
}

/// A drop keeps the SKUs its file leaves out: an import scheduling it races a
/// file scheduling another drop with one of those kept SKUs, and exactly one
/// of the two wins (the import locks the SKUs it keeps, not only its file's).
#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn an_import_scheduling_a_drop_locks_the_skus_it_keeps(pg: PgPool) {
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    let import = |file| spawn_import(&b, file);
    let other = |starts: &str| {
        drop_file::parse(
            &format!("drop,starts_at,sku,product,stock\nother,{starts},KEEP-Y,P,5\n"),
            Format::Csv,
        )
        .unwrap()
    };
    // Drop "keep" holds 300 SKUs and KEEP-Y; its later files list only the 300.
    let (mut sheet, mut lines) = three_hundred("keep", "KP", 10, "");
    let (extra, _) = other("");
    sheet.skus.extend(extra.skus);
    lines.push(302);
    import((sheet, lines)).await.unwrap();
    for round in 0..6 {
        for unscheduled in [three_hundred("keep", "KP", 10, ""), other("")] {
            assert!(matches!(
                import(unscheduled).await.unwrap(),
                ImportOutcome::Done(_)
            ));
        }
        let (k, o) = tokio::join!(
            import(three_hundred("keep", "KP", 10, "2030-03-01T00:00:00Z")),
            import(other("2030-04-01T00:00:00Z"))
        );
        let k_won = matches!(k.unwrap(), ImportOutcome::Done(_));
        let o_won = matches!(o.unwrap(), ImportOutcome::Done(_));
        assert!(k_won != o_won, "round {round}: keep {k_won}, other {o_won}");
        let drops: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM drop_skus ds JOIN drops d ON d.code = ds.drop_code
              WHERE ds.sku = 'KEEP-Y' AND (d.starts_at IS NOT NULL OR d.ends_at IS NOT NULL)",
        )
        .fetch_one(&b.pg)
        .await
        .unwrap();
        assert_eq!(drops, 1, "round {round}: KEEP-Y in one scheduled drop");
    }
}

/// A SKU of a drop that has ended can be sold again in a new drop: the new
/// drop's schedule is taken (not refused as a second scheduled drop), the
/// counter follows it, and the ended drop keeps its own schedule (its report
/// keeps its window). A drop whose end is still ahead keeps the SKU to itself.
#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_sku_of_an_ended_drop_is_sold_again_in_a_new_one(pg: PgPool) {
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    let file = |code: &str, starts: &str, ends: &str| {
        format!("drop,starts_at,ends_at,sku,product,stock\n{code},{starts},{ends},AGAIN-1,P,5\n")
    };
    imported(
        &b,
        &file("past", "2020-01-01T00:00:00Z", "2020-01-02T00:00:00Z"),
    )
    .await;
    let ended = b
        .engine
        .reserve(&ReserveRequest::single("late", "AGAIN-1", 1))
        .await
        .unwrap();
    assert!(matches!(ended, ReserveOutcome::Ended { .. }), "{ended:?}");

    imported(&b, &file("next", "2040-01-01T00:00:00Z", "")).await;
    let f = b.engine.figures("AGAIN-1").await.unwrap().unwrap();
    assert_eq!((f.opens_at_ms, f.closes_at_ms), (2_208_988_800_000, 0));
    let (_, past) = schedule::named_drop(&b.pg, "past").await.unwrap().unwrap();
    assert!(past.ends_at.is_some(), "the ended drop keeps its schedule");
    let report = verify(&b.engine, &b.pg, &VerifyOptions::default())
        .await
        .unwrap();
    assert!(report.passed(), "{:?}", report.checks);

    // "next" has not ended: a third drop cannot schedule the SKU.
    let ImportOutcome::Refused(problems) = import_text(
        &b,
        &file("third", "2041-01-01T00:00:00Z", ""),
        Format::Csv,
        false,
    )
    .await
    else {
        panic!("scheduled in two drops that have not ended");
    };
    assert!(problems[0].message.contains("(in next)"), "{problems:?}");

    // A reason PostgreSQL cannot store is refused by name, not a failed write.
    let (sheet, lines) = drop_file::parse(&file("next", "", ""), Format::Csv).unwrap();
    let nul = ImportOptions {
        reason: "a\0b",
        ..options(false)
    };
    let ImportOutcome::Refused(problems) = drop_file::import(&b.engine, &b.pg, &sheet, &lines, nul)
        .await
        .unwrap()
    else {
        panic!("imported");
    };
    assert_eq!(problems[0].column, "reason");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn values_the_database_or_redis_would_refuse_are_refused_first(pg: PgPool) {
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    let long = "P".repeat(150);
    let json = format!(
        r#"{{"code": "odd", "skus": [
            {{"sku": "O-1", "product": "P", "stock": 9007199254740993}},
            {{"sku": "O-2", "product": "{long}", "variant": "{}", "stock": 1}},
            {{"sku": "O-3", "product": "P\u0000", "stock": 1}}]}}"#,
        "V".repeat(60)
    );
    let ImportOutcome::Refused(problems) = import_text(&b, &json, Format::Json, false).await else {
        panic!("imported");
    };
    let at: Vec<&str> = problems.iter().map(|p| p.column.as_str()).collect();
    assert_eq!(
        at,
        ["skus[0].stock", "skus[1].title", "skus[2].product"],
        "{problems:#?}"
    );
    // A CSV names every bad place, not only the first unreadable cell.
    let csv = "drop,sku,product,stock\nodd,O-1,P,abc\nodd,bad sku,P,1\nodd,O-3,,1\n";
    let ImportOutcome::Refused(problems) = import_text(&b, csv, Format::Csv, false).await else {
        panic!("imported");
    };
    let at: Vec<(Option<u64>, &str)> = problems
        .iter()
        .map(|p| (p.line, p.column.as_str()))
        .collect();
    assert_eq!(
        at,
        [(Some(2), "stock"), (Some(3), "sku"), (Some(4), "product")]
    );
    let skus: i64 = sqlx::query_scalar("SELECT count(*) FROM skus")
        .fetch_one(&b.pg)
        .await
        .unwrap();
    assert_eq!(skus, 0);
}

/// Times are taken to the millisecond, the precision Redis decides with: a
/// start and end a fraction of a millisecond apart are one instant (refused
/// at `ends_at`, not a database error), a file with finer digits imports
/// twice without a change the second time, and a year past 9999 (which RFC
/// 3339 cannot write back) is refused.
#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn drop_times_are_taken_to_the_millisecond(pg: PgPool) {
    let redis = TestRedis::start();
    let b = backends(pg, &redis.url()).await;
    let file = |starts: &str, ends: &str| {
        format!(
            r#"{{"code": "prec", "starts_at": "{starts}", "ends_at": {ends},
                "skus": [{{"sku": "PR-1", "product": "P", "stock": 3}}]}}"#
        )
    };
    let refused = |outcome: ImportOutcome| match outcome {
        ImportOutcome::Refused(problems) => problems
            .iter()
            .map(|p| format!("{}: {}", p.column, p.message))
            .collect::<Vec<_>>(),
        ImportOutcome::Done(report) => panic!("imported: {report:?}"),
    };
    let same_ms = file(
        "2030-01-01T00:00:00.0000001Z",
        r#""2030-01-01T00:00:00.0000002Z""#,
    );
    assert_eq!(
        refused(import_text(&b, &same_ms, Format::Json, false).await),
        ["ends_at: the end must come after the start"]
    );
    let y10k = file("2030-01-01T00:00:00Z", r#""9999-12-31T23:59:59-14:00""#);
    assert_eq!(
        refused(import_text(&b, &y10k, Format::Json, false).await),
        ["ends_at: the end must be before the year 10000"]
    );

    let fine = file("2030-01-01T00:00:00.0005005Z", "null");
    for round in 0..2 {
        let ImportOutcome::Done(report) = import_text(&b, &fine, Format::Json, false).await else {
            panic!("refused");
        };
        if round == 1 {
            assert!(report.changes.is_empty(), "{:?}", report.changes);
        }
    }
    let (_, schedule) = schedule::named_drop(&b.pg, "prec").await.unwrap().unwrap();
    let starts = schedule.starts_at.unwrap();
    assert_eq!(
        (starts.timestamp(), starts.timestamp_subsec_nanos()),
        (1_893_456_000, 0)
    );
    // The command line's path (and the dashboard's) refuses the same way.
    let same = DropSchedule {
        starts_at: Some("2031-01-01T00:00:00.0000001Z".parse().unwrap()),
        ends_at: Some("2031-01-01T00:00:00.0000009Z".parse().unwrap()),
    };
    assert_eq!(
        schedule::schedule_drop(&b.engine, &b.pg, "prec", same)
            .await
            .unwrap(),
        ScheduleOutcome::Invalid("the end must come after the start".into())
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn an_export_imported_back_keeps_a_supplier_restock(pg: PgPool) {
    let redis = TestRedis::start();
    holdfast_engine::catalog::load_demo_drop(&pg).await.unwrap();
    let b = backends(pg, &redis.url()).await;
    holdfast_engine::warmup::warm_all(
        &b.engine,
        &b.pg,
        holdfast_engine::warmup::WarmOptions::default(),
        |_| {},
    )
    .await
    .unwrap();
    let sheet = drop_file::export(&b.pg, holdfast_engine::catalog::DEMO_DROP)
        .await
        .unwrap()
        .unwrap();
    // A supplier delivers 50 more after the export.
    b.engine
        .apply_delta("DROP-003", 50, "erp", "po-1")
        .await
        .unwrap();
    drain(&b, &redis).await;
    let text = drop_file::render(&sheet, Format::Csv);
    let report = imported(&b, &text).await;
    assert!(report.changes.is_empty(), "{:?}", report.changes);
    assert_eq!(available(&b.engine, "DROP-003").await, 550);
}
