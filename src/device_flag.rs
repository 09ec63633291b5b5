//! `--device cpu | gpu | gpu:N`: where model steps are to run. The CPU is the default; a GPU is
//! opened at startup so `serve` says which adapter it found, or why there is none, before
//! anything else loads. Model steps on the GPU are not wired yet (issue 41): a GPU found is
//! announced and the model still runs on the CPU.

use std::str::FromStr;

use anyhow::Context;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    Cpu,
    /// The adapter of that index in `spindle_gpu::Gpu::adapters`; `None`: the first real GPU.
    Gpu(Option<usize>),
}

impl FromStr for DeviceChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("unknown device `{text}`; expected cpu, gpu or gpu:N");
        match text.split_once(':') {
            None if text == "cpu" => Ok(Self::Cpu),
            None if text == "gpu" => Ok(Self::Gpu(None)),
            Some(("gpu", index)) => index.parse().map(|i| Self::Gpu(Some(i))).map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

/// Opens the GPU `choice` names and returns the startup line about it (`None` for the CPU), or
/// an error that says what was tried and found.
pub fn announce_line(choice: DeviceChoice) -> anyhow::Result<Option<String>> {
    let DeviceChoice::Gpu(index) = choice else { return Ok(None) };
    quiet_mesa_device_select();
    let gpu = spindle_gpu::Gpu::open(index).context("--device")?;
    Ok(Some(format!(
        "GPU {}: found; model steps still run on the CPU (the GPU path is in progress)",
        gpu.adapter()
    )))
}

/// Mesa's device-select layer, loaded with any Mesa Vulkan driver, asks the display server
/// which GPU is the default and prints an `error:` line when there is none (a headless server,
/// where XDG_RUNTIME_DIR is unset); without a display it has nothing to choose by, so it is
/// switched off there. Runs before the engine starts any thread that reads the environment.
fn quiet_mesa_device_select() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none()
        && std::env::var_os("NODEVICE_SELECT").is_none()
    {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_unknown_ones_are_named() {
        assert_eq!("cpu".parse(), Ok(DeviceChoice::Cpu));
        assert_eq!("gpu".parse(), Ok(DeviceChoice::Gpu(None)));
        assert_eq!("gpu:2".parse(), Ok(DeviceChoice::Gpu(Some(2))));
        for bad in ["tpu", "gpu:", "gpu:x", "cpu:0", "gpu:-1"] {
            let err = bad.parse::<DeviceChoice>().unwrap_err();
            assert!(err.contains(&format!("`{bad}`")) && err.contains("gpu:N"), "{err}");
        }
    }
}
