//! `--cow`, `--name`, `--state` of `hako run` and `hako shell`: a
//! copy-on-write workspace (the `linux`, `docker` and `gvisor` backends), its layers kept as a
//! named sandbox or in a temporary place for one run, and held (locked)
//! until the sandbox is gone.

use std::path::{Path, PathBuf};

use clap::Args;
use hako_core::SandboxSpec;
use hako_runtime::BackendArg;

/// The copy-on-write flags.
#[derive(Debug, Clone, Args)]
pub struct CowArgs {
    /// Copy-on-write workspace (linux, docker, gvisor): changes land in a private layer,
    /// never in the workspace; review them with `hako diff NAME`.
    #[arg(long)]
    pub cow: bool,
    /// Keep the --cow layers as the named sandbox NAME (a second run
    /// continues on them) [default: a temporary layer, gone after the run].
    #[arg(long, value_name = "NAME", requires = "cow")]
    pub name: Option<String>,
    /// Where named sandboxes are kept [default: $XDG_STATE_HOME/hako, else ~/.local/state/hako].
    #[arg(long, value_name = "DIR", requires = "name")]
    pub state: Option<PathBuf>,
}

impl CowArgs {
    /// With `--cow`: opens (or makes) the layers, sets them in `spec`, and
    /// has `auto` pick `linux` (a backend that cannot honour them refuses
    /// them by name).
    /// Keep what it returns until the sandbox is gone.
    pub fn apply(
        &self,
        backend: &mut BackendArg,
        spec: &mut SandboxSpec,
    ) -> Result<Option<CowState>, String> {
        if !self.cow {
            return Ok(None);
        }
        if *backend == BackendArg::Auto {
            *backend = BackendArg::Linux;
        }
        let cow = CowState::open(self.name.as_deref(), self.state.as_deref(), spec)?;
        spec.cow = cow.layers();
        Ok(Some(cow))
    }
}

/// The layers of a `--cow` run, held (and locked) until it ends; a
/// temporary one is removed then, whatever the outcome (declared before
/// the sandbox, so dropped after it).
pub struct CowState {
    state: Option<hako_layers::state::State>,
    temporary: Option<tempfile::TempDir>,
}

impl CowState {
    /// The named sandbox's state (made if new), or a temporary one.
    fn open(
        name: Option<&str>,
        state: Option<&Path>,
        spec: &SandboxSpec,
    ) -> Result<CowState, String> {
        use hako_layers::state::{state_root, State};
        let binds: Vec<PathBuf> = spec.rw.iter().chain(&spec.ro).cloned().collect();
        match name {
            Some(name) => {
                let root = state_root(state).map_err(|e| e.to_string())?;
                let state = State::create(&root, name, &spec.workspace, &binds)
                    .map_err(|e| e.to_string())?;
                Ok(CowState {
                    state: Some(state),
                    temporary: None,
                })
            }
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("hako-cow-")
                    .tempdir()
                    .map_err(|e| format!("create a temporary layer: {e}"))?;
                let state = State::create(&dir.path().join("hako"), "cow", &spec.workspace, &binds)
                    .map_err(|e| e.to_string())?;
                Ok(CowState {
                    state: Some(state),
                    temporary: Some(dir),
                })
            }
        }
    }

    fn layers(&self) -> Option<hako_core::CowLayers> {
        self.state.as_ref().map(|state| hako_core::CowLayers {
            upper: state.upper(),
            work: state.work(),
        })
    }
}

impl Drop for CowState {
    fn drop(&mut self) {
        if let (Some(state), Some(_)) = (self.state.take(), &self.temporary) {
            if let Err(e) = state.remove() {
                eprintln!("hako: {}", crate::show::message(&e.to_string()));
            }
        }
    }
}
