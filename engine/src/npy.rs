//! Minimal `.npy` (NumPy v1.0) reading and writing of little-endian f32 arrays.

use std::io::{self, Write};
use std::path::Path;

/// Write `data` with NumPy shape `shape` (C order, outermost first) as `<f4`.
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> io::Result<()> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_s = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_s}, }}");
    // magic(6) + version(2) + len(2) + header + '\n' must be a multiple of 64
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut f = io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(header.len() as u16).to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    for v in data {
        f.write_all(&v.to_le_bytes())?;
    }
    f.flush()
}

/// Read a `.npy` of `<f4` (or `<f8`, converted) in C order: (shape, data).
pub fn read_f32(path: &Path) -> Result<(Vec<usize>, Vec<f32>), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let bad = |m: &str| format!("{}: not a supported .npy file: {m}", path.display());
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("expected the \\x93NUMPY magic"));
    }
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => return Err(bad(&format!("expected version 1, 2 or 3, found {v}"))),
    };
    let header = bytes.get(start..start + hlen).ok_or_else(|| bad("truncated header"))?;
    let header = String::from_utf8_lossy(header);
    if header.contains("'fortran_order': True") {
        return Err(bad("expected C order, found Fortran order"));
    }
    let descr = if header.contains("'<f4'") {
        4
    } else if header.contains("'<f8'") {
        8
    } else {
        return Err(bad(&format!("expected dtype <f4 or <f8, found header {header}")));
    };
    let open = header.find("'shape': (").ok_or_else(|| bad("no shape"))? + 10;
    let close = header[open..].find(')').ok_or_else(|| bad("no shape"))? + open;
    let shape: Vec<usize> = header[open..close]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| bad("bad shape")))
        .collect::<Result<_, _>>()?;
    let n: usize = shape.iter().product();
    let body = &bytes[start + hlen..];
    if body.len() < n * descr {
        return Err(bad(&format!("expected {} data bytes, found {}", n * descr, body.len())));
    }
    let data = if descr == 4 {
        body[..n * 4].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    } else {
        body[..n * 8].chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect()
    };
    Ok((shape, data))
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip() {
        let dir = std::env::temp_dir().join(format!("pn-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.npy");
        let data: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
        super::write_f32(&p, &[2, 3], &data).unwrap();
        let (shape, back) = super::read_f32(&p).unwrap();
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(back, data);
        let raw = std::fs::read(&p).unwrap();
        assert_eq!((raw.len() - 24) % 64, 0, "header padded to 64 bytes");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
