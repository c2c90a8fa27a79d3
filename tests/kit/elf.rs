//! Whether a binary is statically linked (tests/environment.rs: which exit
//! a dynamic build's loader gives; tests/containers: only a static drainit
//! and busybox start in a `FROM scratch` image).

use std::path::Path;

/// True when `path` is a 64-bit little-endian ELF file with no program
/// interpreter (PT_INTERP): it needs no dynamic loader. Err when it cannot be
/// read or is no such ELF file.
pub fn is_static_elf(path: impl AsRef<Path>) -> Result<bool, String> {
    let path = path.as_ref();
    let b = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return Err(format!("{} is not a 64-bit little-endian ELF file", path.display()));
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(b[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        let p_type = b.get(o..o + 4).ok_or_else(|| format!("{}: truncated ELF", path.display()))?;
        if u32::from_le_bytes(p_type.try_into().unwrap()) == 3 {
            return Ok(false); // PT_INTERP: needs a dynamic loader
        }
    }
    Ok(true)
}
