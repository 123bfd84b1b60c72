//! A sandbox for unit tests: the real file fence over a temporary
//! directory, and no commands.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use hako_core::{
    Capabilities, Command, DirListing, Error, FenceResolver, Isolation, MakeDirAll, Metadata,
    NetworkAccess, Optional, Output, ReadLimit, ReadOutcome, Result, Sandbox, StatPath, Workdir,
};
use hako_fence::{Fence, FenceOptions};

pub struct FenceBox {
    fence: Fence,
    caps: Capabilities,
    /// Run once, just before the next edit is written: the sandbox
    /// changing the file between the edit's read and its write.
    pub meanwhile: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl FenceBox {
    pub fn new(root: &Path) -> Self {
        FenceBox {
            fence: Fence::open(root, FenceOptions::default()).unwrap(),
            meanwhile: std::sync::Mutex::new(None),
            caps: Capabilities {
                backend: "test".into(),
                isolation: Isolation::None,
                network: NetworkAccess::None,
                fence: FenceResolver::ComponentWalk,
                limits: Vec::new(),
                env_sanitised: true,
                fds_closed: true,
                landlock_abi: None,
                accelerator: None,
                seccomp: false,
                shared: Vec::new(),
                defects: Vec::new(),
                optional: Optional::default(),
            },
        }
    }
}

impl Sandbox for FenceBox {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }
    fn exec(&self, _: &Command) -> Result<Output> {
        Err(Error::Unsupported {
            backend: "test".into(),
            capability: "exec",
        })
    }
    fn read_file(&self, path: &Path) -> Result<Vec<u8>> {
        Ok(self.fence.read_all(path)?)
    }
    fn write_file(&self, path: &Path, data: &[u8]) -> Result<()> {
        Ok(self.fence.write(path, data)?)
    }
    fn remove(&self, path: &Path) -> Result<()> {
        Ok(self.fence.remove(path)?)
    }
    fn list_dir(&self, path: &Path) -> Result<DirListing> {
        Ok(self.fence.list(path)?)
    }
    fn close(&self) -> Result<()> {
        Ok(())
    }
    fn replace_unchanged(&self) -> Option<&dyn hako_core::ReplaceUnchanged> {
        Some(self)
    }
    fn read_limit(&self) -> Option<&dyn ReadLimit> {
        Some(self)
    }
    fn make_dir_all(&self) -> Option<&dyn MakeDirAll> {
        Some(self)
    }
    fn workdir(&self) -> Option<&dyn Workdir> {
        Some(self)
    }
    fn stat(&self) -> Option<&dyn StatPath> {
        Some(self)
    }
}

impl ReadLimit for FenceBox {
    fn read_file_limit(&self, path: &Path, max: u64) -> Result<ReadOutcome> {
        Ok(self.fence.read(path, max)?)
    }
}

impl MakeDirAll for FenceBox {
    fn make_dir_all(&self, path: &Path) -> Result<()> {
        Ok(self.fence.make_dir_all(path)?)
    }
}

impl Workdir for FenceBox {
    fn workdir(&self) -> &Path {
        self.fence.workdir()
    }
}

impl StatPath for FenceBox {
    fn stat(&self, path: &Path) -> Result<Metadata> {
        Ok(self.fence.stat(path)?)
    }
}

impl hako_core::ReplaceUnchanged for FenceBox {
    fn replace_unchanged(&self, path: &Path, data: &[u8], read: &[u8]) -> Result<()> {
        if let Some(meddle) = self.meanwhile.lock().unwrap().take() {
            meddle();
        }
        Ok(self.fence.write_if_unchanged(path, data, read)?)
    }
}
