//! Structured logging with tracing, and optional trace export over OTLP.
//!
//! Export is off unless the standard OpenTelemetry variables ask for it:
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set,
//! or `OTEL_TRACES_EXPORTER=otlp`; `OTEL_TRACES_EXPORTER=none` or
//! `OTEL_SDK_DISABLED=true` keeps it off. The exporter speaks OTLP over plain
//! HTTP (`OTEL_EXPORTER_OTLP_PROTOCOL` `http/protobuf`, the default, or
//! `http/json`) to a collector or agent next to the server, which forwards over
//! TLS; it also honours `OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT`,
//! `OTEL_SERVICE_NAME` (default `holdfast`), `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER` and `OTEL_BSP_*`.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, fmt};

use crate::config::LogFormat;

/// What [`init`] installed; [`Telemetry::shutdown`] sends the spans still
/// buffered before the process exits.
#[must_use = "shut it down at exit, or the last spans are lost"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported over OTLP.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Flushes and stops the exporter (waits for at most its export timeout).
    /// Call it outside the async runtime: the exporter's client blocks.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: the last traces could not be exported: {e}");
        }
    }
}

/// Installs the global tracing subscriber; an invalid filter falls back to `info`
/// with a warning rather than silencing logs. Fails only on an OTLP setting it
/// cannot honour (a wrong protocol or scheme), so a deployment that asked for
/// traces never runs silently without them. Call it before the async runtime
/// starts: the exporter's HTTP client is a blocking one on its own thread.
pub fn init(filter: &str, format: LogFormat) -> Result<Telemetry, String> {
    let otlp = otlp_settings(&|name| std::env::var(name).ok())?;
    let (env_filter, bad) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
    let provider = otlp.map(build_provider).transpose()?;
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("holdfast"))
            // The exporter's own diagnostics are logged, never exported (a
            // failing collector would otherwise feed itself).
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                !meta.target().starts_with("opentelemetry")
            }))
    });
    let fmt = match format {
        LogFormat::Text => fmt::layer().with_writer(std::io::stderr).boxed(),
        LogFormat::Json => fmt::layer().json().with_writer(std::io::stderr).boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(env_filter)
        .with(fmt)
        .with(otel)
        .try_init();
    if let Some(e) = bad {
        tracing::warn!(filter, error = %e, "invalid log filter; using `info`");
    }
    Ok(Telemetry { provider })
}

/// Where and how to export, read from the standard variables.
#[derive(Debug, PartialEq, Eq)]
struct Otlp {
    /// `http/json` rather than `http/protobuf`. The endpoint, headers and timeout
    /// the exporter reads from the variables itself (it appends `/v1/traces` to
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`; the default is `http://localhost:4318`).
    json: bool,
}

/// The OTLP settings `env` asks for: `None` when export is off.
fn otlp_settings(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Otlp>, String> {
    let set = |name: &str| {
        env(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let exporter = set("OTEL_TRACES_EXPORTER").map(|v| v.to_ascii_lowercase());
    if exporter.as_deref() == Some("none") {
        return Ok(None);
    }
    // The exporter reads the endpoint variables as they are: one with blanks
    // around it would silently go to the default address instead.
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ] {
        if let Some(raw) = env(name)
            && !raw.trim().is_empty()
            && raw.trim() != raw
        {
            return Err(format!("{name} has blanks around it: {raw:?}"));
        }
    }
    let endpoint =
        set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"));
    match exporter.as_deref() {
        Some("otlp") => {}
        Some(other) => {
            return Err(format!(
                "OTEL_TRACES_EXPORTER={other} is not supported: use `otlp` or `none`"
            ));
        }
        None if endpoint.is_none() => return Ok(None),
        None => {}
    }
    if let Some(url) = &endpoint
        && !url.starts_with("http://")
    {
        return Err(format!(
            "OTLP endpoint {url}: this build exports over plain http:// only; run an \
             OpenTelemetry Collector or agent beside the server (it forwards over TLS)"
        ));
    }
    let protocol = set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .map_or_else(|| "http/protobuf".to_owned(), |p| p.to_ascii_lowercase());
    let json = match protocol.as_str() {
        "http/protobuf" => false,
        "http/json" => true,
        other => {
            return Err(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL={other} is not supported: use http/protobuf \
                 (the default, port 4318) or http/json"
            ));
        }
    };
    Ok(Some(Otlp { json }))
}

/// A tracer provider exporting in batches over OTLP/HTTP.
fn build_provider(otlp: Otlp) -> Result<SdkTracerProvider, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(if otlp.json {
            Protocol::HttpJson
        } else {
            Protocol::HttpBinary
        })
        .build()
        .map_err(|e| format!("cannot set up the OTLP exporter: {e}"))?;
    let mut resource = Resource::builder();
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|n| !n.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| {
            a.split(',')
                .filter_map(|kv| kv.split_once('='))
                .any(|(k, v)| k.trim() == "service.name" && !v.trim().is_empty())
        });
    if !named {
        resource = resource.with_service_name("holdfast");
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<Otlp>, String> {
        otlp_settings(&|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn export_is_off_unless_asked_for() {
        assert_eq!(settings(&[]), Ok(None));
        assert_eq!(settings(&[("OTEL_TRACES_EXPORTER", "none")]), Ok(None));
        assert_eq!(
            settings(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_SDK_DISABLED", "true")
            ]),
            Ok(None)
        );
        assert_eq!(
            settings(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_TRACES_EXPORTER", "none")
            ]),
            Ok(None)
        );
    }

    #[test]
    fn an_endpoint_or_the_exporter_name_turns_it_on() {
        assert_eq!(
            settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")]),
            Ok(Some(Otlp { json: false }))
        );
        assert_eq!(
            settings(&[("OTEL_TRACES_EXPORTER", "otlp")]),
            Ok(Some(Otlp { json: false }))
        );
        assert_eq!(
            settings(&[
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://c:4318/v1/traces"
                ),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
            ]),
            Ok(Some(Otlp { json: true }))
        );
    }

    #[test]
    fn names_are_read_as_the_specification_spells_them() {
        assert_eq!(settings(&[("OTEL_TRACES_EXPORTER", "NONE")]), Ok(None));
        assert_eq!(
            settings(&[("OTEL_TRACES_EXPORTER", "OTLP")]),
            Ok(Some(Otlp { json: false }))
        );
        assert_eq!(
            settings(&[
                ("OTEL_TRACES_EXPORTER", "otlp"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "HTTP/JSON")
            ]),
            Ok(Some(Otlp { json: true }))
        );
    }

    #[test]
    fn what_it_cannot_honour_is_refused() {
        for vars in [
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", " http://127.0.0.1:4318")][..],
            &[("OTEL_TRACES_EXPORTER", "zipkin")][..],
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318")][..],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ][..],
        ] {
            assert!(settings(vars).is_err(), "{vars:?}");
        }
    }
}
