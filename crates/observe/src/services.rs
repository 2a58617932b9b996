//! The services that run beside the daemon as their own commands (`filewall
//! run`, `tcps serve`, `sikker agent`, `orion watch`, each with `--metrics
//! ADDR`): the daemon scrapes their `/metrics` once a second on a thread of its
//! own, so the dashboard can show them in its capability panels
//! ([`crate::capability`]) and the daemon's own `/metrics` says whether each
//! is up and relays its key families with a `service` label.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::capability::{self, Capability, Sample, Scrapes};

/// Longest a scrape may take (connect, send, read).
const SCRAPE_TIMEOUT: Duration = Duration::from_millis(500);
/// Largest answer read from a service.
const MAX_BODY: u64 = 4 << 20;
/// Samples kept per service for the dashboard (histogram buckets are left out).
const MAX_SAMPLES: usize = 400;
/// Samples read from one scrape for the panels and the relay.
const MAX_PARSED: usize = 20_000;

/// A service to scrape: `NAME=ADDR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    pub name: String,
    pub addr: SocketAddr,
}

/// Why a `NAME=ADDR` service spec was refused (clap and the config file show it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadServiceSpec {
    #[error("`{0}`: expected NAME=ADDR, e.g. filewall=127.0.0.1:9465")]
    NoEquals(String),
    #[error("`{0}`: a service name is letters, digits, `-` and `_`")]
    BadName(String),
    #[error("`{addr}` is not an address: {source}")]
    BadAddr {
        addr: String,
        #[source]
        source: std::net::AddrParseError,
    },
}

impl FromStr for ServiceSpec {
    type Err = BadServiceSpec;
    fn from_str(s: &str) -> Result<Self, BadServiceSpec> {
        let (name, addr) = s
            .split_once('=')
            .ok_or_else(|| BadServiceSpec::NoEquals(s.to_string()))?;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(BadServiceSpec::BadName(name.to_string()));
        }
        let addr = addr.parse().map_err(|source| BadServiceSpec::BadAddr {
            addr: addr.to_string(),
            source,
        })?;
        Ok(ServiceSpec {
            name: name.to_string(),
            addr,
        })
    }
}

/// What the last scrape of one service found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServiceView {
    pub name: String,
    pub addr: String,
    pub up: bool,
    /// Why the last scrape failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// (series with its labels, value), in the service's order.
    pub samples: Vec<(String, f64)>,
    /// Its capability panel, for a service the dashboard knows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capability: Option<Capability>,
    /// The samples of its key families, for the daemon's `/metrics`.
    #[serde(skip)]
    pub relayed: Vec<Sample>,
}

/// What one scrape of a service read, kept for the next one's rates.
#[derive(Debug, Clone, Default)]
pub struct Scraped {
    at: Option<Instant>,
    samples: Vec<Sample>,
}

/// Scrapes one service now; `last` is what the previous scrape read, and
/// becomes this one's.
pub fn scrape(s: &ServiceSpec, last: &mut Scraped) -> ServiceView {
    let now = Instant::now();
    let (up, error, samples, parsed) = match fetch(s.addr) {
        Ok(body) => (true, None, parse_samples(&body), parse_full(&body)),
        Err(e) => (false, Some(e.to_string()), Vec::new(), Vec::new()),
    };
    let dt_s = last
        .at
        .map_or(0.0, |t| now.saturating_duration_since(t).as_secs_f64());
    let capability = capability::capability(&Scrapes {
        now: &parsed,
        before: (!last.samples.is_empty()).then_some(last.samples.as_slice()),
        dt_s,
    });
    let relayed = capability::relayed(&parsed);
    *last = Scraped {
        at: Some(now),
        samples: parsed,
    };
    ServiceView {
        name: s.name.clone(),
        addr: s.addr.to_string(),
        up,
        error,
        samples,
        capability,
        relayed,
    }
}

/// Every sample of an exposition, with its labels (histogram buckets too).
fn parse_full(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, labels) = capability::parse_series(series)?;
            let value = value.trim().parse().ok()?;
            Some(Sample {
                name,
                labels,
                value,
            })
        })
        .take(MAX_PARSED)
        .collect()
}

/// Why one scrape failed (shown as the service's `error`).
#[derive(Debug, thiserror::Error)]
enum ScrapeError {
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("{0}")]
    Timeouts(std::io::Error),
    #[error("send: {0}")]
    Send(std::io::Error),
    #[error("read: {0}")]
    Read(std::io::Error),
    #[error("not an HTTP answer")]
    NotHttp,
    #[error("HTTP {0}")]
    Status(String),
}

/// GET /metrics with HTTP/1.0 (the service closes after the answer).
fn fetch(addr: SocketAddr) -> Result<String, ScrapeError> {
    let mut c = TcpStream::connect_timeout(&addr, SCRAPE_TIMEOUT).map_err(ScrapeError::Connect)?;
    c.set_read_timeout(Some(SCRAPE_TIMEOUT))
        .map_err(ScrapeError::Timeouts)?;
    c.set_write_timeout(Some(SCRAPE_TIMEOUT))
        .map_err(ScrapeError::Timeouts)?;
    c.write_all(b"GET /metrics HTTP/1.0\r\nHost: sidecore\r\n\r\n")
        .map_err(ScrapeError::Send)?;
    let mut raw = Vec::new();
    c.take(MAX_BODY)
        .read_to_end(&mut raw)
        .map_err(ScrapeError::Read)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or(ScrapeError::NotHttp)?;
    let status = head.split_whitespace().nth(1).unwrap_or("?");
    if status != "200" {
        return Err(ScrapeError::Status(status.to_string()));
    }
    Ok(body.to_string())
}

/// The sample lines of a Prometheus text exposition, without histogram
/// buckets: `series value` pairs.
pub fn parse_samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            if name.ends_with("_bucket") {
                return None;
            }
            Some((series.to_string(), value.trim().parse().ok()?))
        })
        .take(MAX_SAMPLES)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        let s: ServiceSpec = "filewall=127.0.0.1:9465".parse().unwrap();
        assert_eq!(s.name, "filewall");
        assert!(
            "filewall"
                .parse::<ServiceSpec>()
                .unwrap_err()
                .to_string()
                .contains("NAME=ADDR")
        );
        assert!(
            "a b=127.0.0.1:1"
                .parse::<ServiceSpec>()
                .unwrap_err()
                .to_string()
                .contains("service name")
        );
        assert!(
            "x=nowhere"
                .parse::<ServiceSpec>()
                .unwrap_err()
                .to_string()
                .contains("not an address")
        );
        assert_eq!(
            "x=nowhere".parse::<ServiceSpec>().unwrap_err().to_string(),
            "`nowhere` is not an address: invalid socket address syntax"
        );
    }

    #[test]
    fn samples_skip_comments_buckets_and_junk() {
        let t = "# HELP a A\n# TYPE a counter\na_total{x=\"1 2\"} 3\nh_bucket{le=\"1\"} 2\nh_count 2\nbroken\nb NaNx\n";
        assert_eq!(
            parse_samples(t),
            vec![
                ("a_total{x=\"1 2\"}".to_string(), 3.0),
                ("h_count".to_string(), 2.0)
            ]
        );
    }

    #[test]
    fn a_service_that_is_not_there_is_down_with_the_reason() {
        let free = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let v = scrape(
            &ServiceSpec {
                name: "gone".into(),
                addr: free,
            },
            &mut Scraped::default(),
        );
        assert!(
            !v.up && v.error.as_deref().is_some_and(|e| e.contains("connect")),
            "{v:?}"
        );
    }
}
