//! A real headless Chromium, driven over WebDriver (Debian's
//! `chromium-driver`) with fantoccini, for the console's browser tests.
//!
//! [`Browser::start`] returns `None`, after printing why, where Chromium or
//! chromedriver is not installed (bin/test installs both where it can);
//! under CI (`CI=true`) or with `MAAS_REQUIRE_BROWSER=1` (bin/test sets it
//! when the install worked) a missing browser fails the test instead. Each test saves a screenshot
//! under `target/console-screenshots/`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use super::wait_until;

pub struct Browser {
    pub c: Client,
    driver: Child,
    _profile: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path).chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/lib/chromium")]) {
        for n in names {
            let p = dir.join(n);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Browser {
    /// A fresh headless Chromium, or `None` (with a message) where none is installed.
    pub async fn start() -> Option<Browser> {
        let chromium = find(&["chromium", "chromium-browser", "google-chrome"]);
        let driver = find(&["chromedriver"]);
        let (Some(chromium), Some(driver)) = (chromium, driver) else {
            crate::support::missing(
                Some("MAAS_REQUIRE_BROWSER"),
                "browser test: no Chromium and chromedriver installed (Debian: apt-get install chromium chromium-driver)",
            );
            return None;
        };
        let port = free_port();
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("chromedriver-{port}.log"));
        let child = Command::new(&driver)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", driver.display()));
        let profile = TempDir(
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("chromium-{}", uuid::Uuid::new_v4().simple())),
        );
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        wait_until(super::GENEROUS, "chromedriver answers /status", || async {
            http.get(format!("{url}/status"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1400,1000", "--no-first-run", "--no-default-browser-check",
                    format!("--user-data-dir={}", profile.0.display()),
                ],
            }),
        );
        let c = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&url)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "chromedriver at {url} did not start Chromium: {e} (log: {})",
                    log.display()
                )
            });
        Some(Browser {
            c,
            driver: child,
            _profile: profile,
        })
    }

    pub async fn goto(&self, url: &str) {
        self.c.goto(url).await.unwrap_or_else(|e| panic!("goto {url}: {e}"));
    }

    /// Opens `url` and waits until its live stream is open and its live
    /// parts were fetched once (nothing swaps under the test's hands then).
    pub async fn goto_live(&self, url: &str) {
        self.goto(url).await;
        self.wait_js("the page is live", "return document.body.dataset.live === 'on';")
            .await;
    }

    /// Runs `js` (a function body) in the page and returns its value.
    pub async fn js(&self, js: &str) -> serde_json::Value {
        self.c
            .execute(js, vec![])
            .await
            .unwrap_or_else(|e| panic!("script {js:?}: {e}"))
    }

    /// Waits until `js` (a function body returning a boolean) is true in the page.
    pub async fn wait_js(&self, what: &str, js: &str) {
        wait_until(super::GENEROUS, what, || async {
            self.c.execute(js, vec![]).await.ok().and_then(|v| v.as_bool()) == Some(true)
        })
        .await;
    }

    /// The text of the first element matching `css` (waits for one), read
    /// in one script so a live swap cannot make it stale in between.
    pub async fn text(&self, css: &str) -> String {
        let sel = serde_json::to_string(css).unwrap();
        let js = format!("const e = document.querySelector({sel}); return e ? e.innerText : null;");
        let deadline = tokio::time::Instant::now() + super::GENEROUS;
        loop {
            let got = self
                .c
                .execute(&js, vec![])
                .await
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned));
            if let Some(t) = got {
                return t;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no element {css} within {:?}",
                super::GENEROUS
            );
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
    }

    /// Types `text` into the field `css`.
    pub async fn fill(&self, css: &str, text: &str) {
        let el = self
            .c
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        el.clear().await.unwrap();
        el.send_keys(text).await.unwrap();
    }

    /// Clicks the element `css`; found again when a live swap replaced it.
    pub async fn click(&self, css: &str) {
        let deadline = tokio::time::Instant::now() + super::GENEROUS;
        loop {
            let tried = match self.c.find(Locator::Css(css)).await {
                Ok(el) => el.click().await,
                Err(e) => Err(e),
            };
            match tried {
                Ok(()) => return,
                Err(e) if tokio::time::Instant::now() >= deadline => panic!("click {css}: {e}"),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(25)).await,
            }
        }
    }

    /// Marks the page; [`Browser::same_page`] tells whether it was reloaded since.
    pub async fn mark(&self) {
        self.js("window.__maasMark = 'kept'; return true;").await;
    }

    pub async fn same_page(&self) -> bool {
        self.js("return window.__maasMark === 'kept';").await == json!(true)
    }

    /// Saves a screenshot as `target/console-screenshots/NAME.png` (and
    /// returns its path).
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        let png = self.c.screenshot().await.unwrap();
        std::fs::write(&path, png).unwrap();
        path
    }

    pub async fn close(mut self) {
        let _ = self.c.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
