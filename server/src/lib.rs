//! pn-server: `pn serve`, an OpenAI-compatible HTTP server on the decode slots
//! (docs/server.md).
//!
//! Threads: tokio serves HTTP (parsing, the chat template, tokenization, SSE); one engine
//! thread ([`engine`]) owns the runner, the slots and the prefix cache and runs the
//! continuous batch. They talk through a bounded job queue and one event channel per
//! request; a request whose client goes away is cancelled within one step.
// unsafe only in `malloc` (one mallopt call)
#![deny(unsafe_code)]

pub mod engine;
pub mod error;
pub mod generation;
pub mod malloc;
pub mod metrics;
pub mod params;
pub mod prompt;
mod respond;
mod routes;
pub mod think;
mod web;

pub use engine::{DraftSpec, ModelSpec, Shared, DEFAULT_WAVE_TOKENS};
pub use error::ApiError;
pub use params::Defaults;

use engine::{Job, ModelInfo, Msg};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the server listens and what it allows.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Clients must send `Authorization: Bearer KEY` (not for /health).
    pub api_key: Option<String>,
    /// Origins allowed by CORS (`*`: any); empty: no CORS headers.
    pub cors: Vec<String>,
    /// Requests waiting for a slot at most; more get 503 with `Retry-After`.
    pub queue: usize,
    /// Largest request body in bytes (413 past it).
    pub max_body: usize,
    /// How long running streams may go on after SIGTERM / Ctrl-C.
    pub grace: Duration,
    pub defaults: Defaults,
}

impl ServerConfig {
    pub const DEFAULT_MAX_BODY: usize = 4 << 20;
    pub const DEFAULT_QUEUE: usize = 64;
}

/// The server's state, shared by the handlers.
pub struct Server {
    cfg: ServerConfig,
    shared: Arc<Shared>,
    jobs: Mutex<Option<Sender<Msg>>>,
    shutting_down: AtomicBool,
    next_id: AtomicU64,
    engine: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Server {
    /// Start the engine thread: it runs `load`, reports to `ready` (the memory ladders'
    /// notes, or why loading failed), then serves jobs.
    pub fn start<L, R>(cfg: ServerConfig, load: L, ready: R) -> std::io::Result<Arc<Server>>
    where
        L: FnOnce() -> anyhow::Result<ModelSpec> + Send + 'static,
        R: FnOnce(anyhow::Result<Vec<String>>) + Send + 'static,
    {
        let (tx, rx) = channel();
        let shared = Arc::new(Shared::default());
        let sh = shared.clone();
        let t = std::thread::Builder::new().name("pn-engine".into()).spawn(move || engine::run(load, rx, sh, ready))?;
        Ok(Arc::new(Server {
            cfg,
            shared,
            jobs: Mutex::new(Some(tx)),
            shutting_down: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            engine: Mutex::new(Some(t)),
        }))
    }

    /// [`Server::start`] with a loaded model; returns once the engine is ready.
    pub fn with_model(cfg: ServerConfig, spec: ModelSpec) -> anyhow::Result<Arc<Server>> {
        let (tx, rx) = channel();
        let s = Server::start(cfg, move || Ok(spec), move |r| {
            let _ = tx.send(r);
        })?;
        rx.recv().map_err(|_| anyhow::anyhow!("the engine thread ended while loading"))??;
        Ok(s)
    }

    /// The HTTP routes (for `axum::serve`, or `tower::ServiceExt::oneshot` in tests).
    pub fn router(self: &Arc<Server>) -> axum::Router {
        routes::router(self.clone())
    }

    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(crate) fn model(&self) -> Result<Arc<ModelInfo>, ApiError> {
        self.shared.info.get().cloned().ok_or_else(|| ApiError::unavailable("the model is still loading"))
    }

    pub(crate) fn request_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
        format!("{prefix}-{t:x}{n:06x}")
    }

    /// Queue a job, or 503 when the queue is full or the server is shutting down.
    pub(crate) fn submit(&self, job: Job) -> Result<(), ApiError> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        let depth = &self.shared.metrics.queue_depth;
        if depth.fetch_add(1, Ordering::SeqCst) >= self.cfg.queue as u64 {
            depth.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::queue_full(self.cfg.queue));
        }
        let sent = self.jobs.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|tx| tx.send(Msg::Job(Box::new(job))).is_ok());
        if sent != Some(true) {
            depth.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::unavailable("the engine has stopped"));
        }
        Ok(())
    }

    /// Whether the engine thread has ended (a failed load, or a bug).
    pub fn engine_stopped(&self) -> bool {
        self.engine.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_none_or(|t| t.is_finished())
    }

    /// Stop taking requests (running ones go on).
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// End every generation now.
    pub fn cancel_all(&self) {
        if let Some(tx) = self.jobs.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let _ = tx.send(Msg::CancelAll);
        }
    }

    /// Close the job queue and wait for the engine thread to finish its work.
    pub fn stop_engine(&self) {
        self.begin_shutdown();
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.engine.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// Wait for SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// `pn serve`: bind, load the model on the engine thread (`/health` is 503 meanwhile),
/// print the ready line, serve until SIGTERM / Ctrl-C, let running streams finish within
/// the grace period, return.
pub fn serve<L>(cfg: ServerConfig, load: L) -> anyhow::Result<()>
where
    L: FnOnce() -> anyhow::Result<ModelSpec> + Send + 'static,
{
    malloc::pin_mmap_threshold();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        let local = listener.local_addr()?;
        let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel();
        let server = Server::start(cfg.clone(), load, move |r| {
            let _ = loaded_tx.send(r);
        })?;
        let app = server.router();
        let srv = server.clone();
        let serving = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    shutdown_signal().await;
                    srv.begin_shutdown();
                    let grace = srv.cfg.grace;
                    eprintln!("shutting down: no new requests; running streams get {:.0}s to finish", grace.as_secs_f64());
                    let s2 = srv.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(grace).await;
                        s2.cancel_all();
                        // a client that never reads must not hold the process
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        std::process::exit(0);
                    });
                })
                .await
        });
        let notes = match loaded_rx.await {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(e),
            Err(_) => anyhow::bail!("the engine thread ended while loading"),
        };
        notes.iter().for_each(|n| eprintln!("{n}"));
        let info = server.model().map_err(|e| anyhow::anyhow!("{e}"))?;
        println!("listening on http://{local}, model {}, {} slots", info.name, info.n_slots);
        use std::io::Write;
        let _ = std::io::stdout().flush();
        serving.await??;
        server.stop_engine();
        eprintln!("stopped");
        Ok(())
    })
}
