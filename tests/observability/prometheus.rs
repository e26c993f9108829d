//! A private Prometheus server, started (and installed when missing) by
//! `scripts/services.sh up prometheus` in a state folder of its own, stopped by
//! `services.sh down` when dropped; and the few calls of its HTTP API the tests make.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

/// The repository's root.
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the repository")
        .to_path_buf()
}

/// A private Prometheus server and its `promtool`.
pub struct Prometheus {
    state: PathBuf,
    /// `host:port` of its HTTP API.
    pub address: String,
    pub promtool: PathBuf,
}

impl Prometheus {
    /// Starts a server of its own (own port, the first free one from `port` on,
    /// configuration and data, in a fresh state folder named after `name`) that scrapes
    /// `targets` (`host:port`, `/metrics`) every second and evaluates the rule files
    /// `rules`.
    pub fn start(name: &str, port: u16, targets: &[String], rules: &[PathBuf]) -> Prometheus {
        let state =
            std::env::temp_dir().join(format!("idem-observability-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state);
        let rules: Vec<String> = rules.iter().map(|p| p.display().to_string()).collect();
        // One start at a time: on a machine without Prometheus, two installs at once
        // would meet on the package manager's lock.
        static STARTING: Mutex<()> = Mutex::new(());
        let _one_at_a_time = STARTING.lock().unwrap_or_else(|e| e.into_inner());
        let output = Command::new("bash")
            .arg(repository().join("scripts/services.sh"))
            .args(["up", "--print-env", "prometheus"])
            .env("IDEM_SERVICES_DIR", &state)
            .env("PROMETHEUS_PORT", port.to_string())
            .env("PROMETHEUS_TARGETS", targets.join(","))
            .env("PROMETHEUS_RULES", rules.join(","))
            .output()
            .expect("run scripts/services.sh");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "scripts/services.sh up prometheus failed ({}):\n{stdout}{stderr}",
            output.status
        );
        let exported = |name: &str| {
            stdout
                .lines()
                .find_map(|line| line.strip_prefix(&format!("export {name}=")))
                .unwrap_or_else(|| panic!("services.sh prints {name}:\n{stdout}{stderr}"))
                .trim_matches('\'')
                .to_owned()
        };
        let url = exported("PROMETHEUS_URL");
        Prometheus {
            state,
            address: url
                .strip_prefix("http://")
                .expect("an http:// URL")
                .to_owned(),
            promtool: PathBuf::from(exported("PROMTOOL")),
        }
    }

    /// GET `path` (with its query string) from the API: the `data` of a successful
    /// answer, or the error Prometheus gave.
    pub async fn get(&self, path: String) -> Result<Value, String> {
        let address = self.address.clone();
        tokio::task::spawn_blocking(move || get(&address, &path))
            .await
            .expect("the HTTP request's thread")
    }

    /// An instant query's result (`data.result`).
    pub async fn query(&self, query: &str) -> Result<Vec<Value>, String> {
        let data = self
            .get(format!("/api/v1/query?query={}", encode(query)))
            .await?;
        match &data["result"] {
            Value::Array(result) => Ok(result.clone()),
            // A scalar or a string: one value.
            other => Ok(vec![other.clone()]),
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let output = Command::new("bash")
            .arg(repository().join("scripts/services.sh"))
            .arg("down")
            .env("IDEM_SERVICES_DIR", &self.state)
            .output();
        match output {
            Ok(output) if output.status.success() => {
                let _ = std::fs::remove_dir_all(&self.state);
            }
            Ok(output) => eprintln!(
                "services.sh down failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(error) => eprintln!("services.sh down did not run: {error}"),
        }
    }
}

/// A plain HTTP/1.0 GET (the API answers on loopback, without TLS).
fn get(address: &str, path: &str) -> Result<Value, String> {
    let mut stream = TcpStream::connect(address).map_err(|e| format!("connect {address}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {address}\r\nAccept: application/json\r\n\r\n"
    )
    .map_err(|e| format!("send to {address}: {e}"))?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| format!("read from {address}: {e}"))?;
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let value: Value =
        serde_json::from_str(body).map_err(|e| format!("not JSON ({e}): {answer}"))?;
    if value["status"] == "success" {
        Ok(value["data"].clone())
    } else {
        Err(format!("{}: {}", value["errorType"], value["error"]))
    }
}

/// Percent-encodes a query string's value.
pub fn encode(text: &str) -> String {
    let mut encoded = String::new();
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                encoded.push(byte as char);
            }
            _ => encoded.push_str(&format!("%{byte:02X}")),
        }
    }
    encoded
}
