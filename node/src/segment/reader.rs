//! Reading a segment: open checks the prologue, header, footer and trailer
//! and keeps the header, block index and bloom filter in memory; blocks are
//! read with positioned reads on demand and checked (crc32c, then the decoded
//! rows against the block index) before any row is returned.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use xxhash_rust::xxh3::Xxh3;

use super::block::decode_rows;
use super::bloom::Bloom;
use super::format::*;
use super::{Damage, Error, Result, Row, SegmentHeader, SegmentStats};
use crate::fixed;

/// Bytes read at a time when hashing a whole file.
const HASH_CHUNK_BYTES: usize = 1 << 20;

/// Positioned reads of a segment held somewhere other than a local file
/// (the cold tier: `node::tier::cold`). Implementations verify nothing; the
/// reader checks every byte it uses exactly as it does for a local file.
pub trait RangeRead: Send + Sync + std::fmt::Debug {
    /// Total length in bytes.
    fn byte_len(&self) -> u64;
    /// Exactly `len` bytes at `offset`, or an error.
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>>;
    /// Called when bytes from this source failed a check: drop anything
    /// cached, so the next read fetches them again.
    fn invalidate(&self) {}
}

/// Where a reader's bytes come from.
#[derive(Debug)]
enum Source {
    File(File),
    Remote(Arc<dyn RangeRead>),
}

/// An open segment file.
#[derive(Debug)]
pub struct SegmentReader {
    path: PathBuf,
    file: Source,
    file_len: u64,
    id: String,
    header: SegmentHeader,
    stats: SegmentStats,
    blocks: Vec<BlockMeta>,
    bloom: Bloom,
    /// End of the header: bytes `[0, header_end)` are the prologue and
    /// header, `[footer_offset, file_len)` the footer and trailer.
    header_end: u64,
    footer_offset: u64,
    file_xxh3: u64,
    row_schema: u32,
}

impl SegmentReader {
    /// Opens and checks a segment, computing its id by hashing the whole file
    /// once (sequential reads of 1 MiB, not kept in memory); the whole-file
    /// xxh3-64 in the trailer is checked on the way, so any damage fails here.
    pub fn open(path: &Path) -> Result<Self> {
        let mut reader = Self::open_structure(path, String::new())?;
        let (prefix_hash, full_hash) = reader.hash_file()?;
        if prefix_hash != reader.file_xxh3 {
            // Name the damaged block if there is one; it is more useful than "somewhere".
            reader.verify_blocks()?;
            return Err(reader.corrupt(
                reader.file_len - TRAILER_LEN as u64,
                format!(
                    "whole-file xxh3-64 {prefix_hash:016x} does not match the trailer's {:016x}",
                    reader.file_xxh3
                ),
            ));
        }
        reader.id = format!("{full_hash:032x}");
        Ok(reader)
    }

    /// Opens and checks a segment whose id the caller already knows (from the
    /// catalog), without reading the blocks. Damage inside a block is then
    /// found when that block is read; [`Self::verify_all`] checks everything,
    /// including that the content hashes to `id`.
    pub fn open_with_id(path: &Path, id: &str) -> Result<Self> {
        check_id(id)?;
        Self::open_structure(path, id.to_owned())
    }

    /// Opens a segment held remotely (the cold tier) whose id the caller
    /// knows. The same structural checks as [`Self::open_with_id`] run on
    /// the fetched prologue, header, footer and trailer; blocks are fetched
    /// and checked when read. `name` only labels errors.
    pub fn open_remote(name: &str, id: &str, source: Arc<dyn RangeRead>) -> Result<Self> {
        check_id(id)?;
        let len = source.byte_len();
        Self::from_source(Path::new(name), Source::Remote(source), len, id.to_owned())
    }

    /// True when the bytes come from the cold tier, not a local file.
    pub fn is_remote(&self) -> bool {
        matches!(self.file, Source::Remote(_))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    pub fn stats(&self) -> &SegmentStats {
        &self.stats
    }

    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    pub fn block_count(&self) -> usize {
        self.blocks.len()
    }

    /// File offsets of the blocks, in order (for tools and tests).
    pub fn block_offsets(&self) -> Vec<u64> {
        self.blocks.iter().map(|b| b.offset).collect()
    }

    /// The one namespace every row of the segment belongs to, if there is
    /// one (every block starts and ends in it; rows are sorted by namespace
    /// first, so no other namespace can hide inside).
    pub fn sole_namespace(&self) -> Option<&str> {
        let first = self.blocks.first()?.first_namespace.as_str();
        self.blocks
            .iter()
            .all(|b| b.first_namespace == first && b.last_namespace == first)
            .then_some(first)
    }

    /// False means the segment holds no row of this key; true means it may.
    pub fn may_contain_key(&self, namespace: &str, key: &[u8]) -> bool {
        self.bloom.may_contain(namespace, key)
    }

    /// Rows of one key with `ts_from <= ts < ts_to`, ascending by
    /// `(ts, index, slot)`, strictly after the cursor `after = (ts, index, slot)`
    /// if given, at most `limit` of them.
    pub fn scan_key(
        &self,
        namespace: &str,
        key: &[u8],
        ts_from: u64,
        ts_to: u64,
        after: Option<(u64, u64, u32)>,
        limit: usize,
    ) -> Result<Vec<Row>> {
        let mut out = Vec::new();
        if limit == 0 || ts_from >= ts_to || !self.may_contain_key(namespace, key) {
            return Ok(out);
        }
        for i in self.key_blocks(namespace, key) {
            let meta = &self.blocks[i];
            if meta.ts_max < ts_from || meta.ts_min >= ts_to {
                continue;
            }
            for row in self.read_block(i)? {
                if row.namespace != namespace
                    || row.key != key
                    || row.ts < ts_from
                    || row.ts >= ts_to
                {
                    continue;
                }
                if after.is_some_and(|c| (row.ts, row.index, row.slot) <= c) {
                    continue;
                }
                out.push(row);
                if out.len() == limit {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// The key's latest written record: the highest `(index, slot)`, whatever
    /// its ts. Used for Get and for conditional-append versions.
    pub fn latest(&self, namespace: &str, key: &[u8]) -> Result<Option<Row>> {
        if !self.may_contain_key(namespace, key) {
            return Ok(None);
        }
        let mut best: Option<Row> = None;
        for i in self.key_blocks(namespace, key) {
            for row in self.read_block(i)? {
                if row.namespace == namespace
                    && row.key == key
                    && best
                        .as_ref()
                        .is_none_or(|b| (row.index, row.slot) > (b.index, b.slot))
                {
                    best = Some(row);
                }
            }
        }
        Ok(best)
    }

    /// All rows of `namespace` whose key starts with `key_prefix` and whose
    /// ts is in `[ts_from, ts_to)`, in segment order `(key, ts, index, slot)`.
    /// Blocks outside the key range or the ts range are not read.
    pub fn scan(
        &self,
        namespace: &str,
        key_prefix: &[u8],
        ts_from: u64,
        ts_to: u64,
    ) -> Result<Vec<Row>> {
        let mut out = Vec::new();
        if ts_from >= ts_to {
            return Ok(out);
        }
        let start = self.blocks.partition_point(|b| {
            (b.last_namespace.as_str(), b.last_key.as_slice()) < (namespace, key_prefix)
        });
        for i in start..self.blocks.len() {
            let meta = &self.blocks[i];
            // Keys with the prefix form one contiguous run; a block whose first
            // key is past the prefix (and does not start with it) is past the run.
            let first_ns = meta.first_namespace.as_str();
            if first_ns > namespace
                || (first_ns == namespace
                    && meta.first_key.as_slice() > key_prefix
                    && !meta.first_key.starts_with(key_prefix))
            {
                break;
            }
            if meta.ts_max < ts_from || meta.ts_min >= ts_to {
                continue;
            }
            out.extend(self.read_block(i)?.into_iter().filter(|r| {
                r.namespace == namespace
                    && r.key.starts_with(key_prefix)
                    && r.ts >= ts_from
                    && r.ts < ts_to
            }));
        }
        Ok(out)
    }

    /// Every row of the segment, in segment order (compaction).
    pub fn rows(&self) -> Result<Vec<Row>> {
        // The header's count is checked against the blocks', not against
        // their bytes as decoded: size by what decodes.
        let mut out = Vec::with_capacity(self.stats.rows.min(ROWS_PREALLOC_MAX) as usize);
        for i in 0..self.blocks.len() {
            out.extend(self.read_block(i)?);
        }
        Ok(out)
    }

    /// Scrub: reads and checks every block, then the whole-file xxh3-64 and
    /// that the content hashes to the id.
    pub fn verify_all(&self) -> Result<()> {
        self.verify_blocks()?;
        let (prefix_hash, full_hash) = self.hash_file()?;
        let trailer_at = self.file_len - TRAILER_LEN as u64;
        if prefix_hash != self.file_xxh3 {
            return Err(self.corrupt(
                trailer_at,
                "whole-file xxh3-64 does not match the trailer".into(),
            ));
        }
        if format!("{full_hash:032x}") != self.id {
            return Err(self.corrupt(
                0,
                format!(
                    "content hashes to {full_hash:032x}, not to the segment id {}",
                    self.id
                ),
            ));
        }
        Ok(())
    }

    fn verify_blocks(&self) -> Result<()> {
        for i in 0..self.blocks.len() {
            self.read_block(i)?;
        }
        Ok(())
    }

    /// Indexes of the blocks whose `[first, last]` (namespace, key) range holds the key.
    fn key_blocks(&self, namespace: &str, key: &[u8]) -> std::ops::Range<usize> {
        let target = (namespace, key);
        let start = self
            .blocks
            .partition_point(|b| (b.last_namespace.as_str(), b.last_key.as_slice()) < target);
        let end = self
            .blocks
            .partition_point(|b| (b.first_namespace.as_str(), b.first_key.as_slice()) <= target);
        start..end.max(start)
    }

    fn corrupt(&self, offset: u64, what: String) -> Error {
        Error::Corrupt {
            file: self.path.clone(),
            offset,
            what,
        }
    }

    fn read_at(&self, offset: u64, len: usize, op: &'static str) -> Result<Vec<u8>> {
        read_at(&self.file, &self.path, offset, len, op)
    }

    fn hash_file(&self) -> Result<(u64, u128)> {
        let prefix_len = self.file_len - TRAILER_LEN as u64;
        let mut prefix = Xxh3::new();
        let mut full = Xxh3::new();
        let mut at = 0u64;
        while at < self.file_len {
            let len = (self.file_len - at).min(HASH_CHUNK_BYTES as u64) as usize;
            let chunk = self.read_at(at, len, "hashing the file")?;
            if at < prefix_len {
                let in_prefix = (prefix_len - at).min(len as u64) as usize;
                prefix.update(&chunk[..in_prefix]);
            }
            full.update(&chunk);
            at += len as u64;
        }
        Ok((prefix.digest(), full.digest128()))
    }

    /// Reads block `i`, checks its crc32c, decompresses it within its declared
    /// size and checks the rows against the block index and the header.
    fn read_block(&self, i: usize) -> Result<Vec<Row>> {
        match (self.read_block_once(i), &self.file) {
            // Damage may be in a cached copy or in transit: fetch once more
            // from the source; damage that persists is reported.
            (Err(Error::Corrupt { .. }), Source::Remote(remote)) => {
                remote.invalidate();
                self.read_block_once(i)
            }
            (result, _) => result,
        }
    }

    fn read_block_once(&self, i: usize) -> Result<Vec<Row>> {
        let meta = &self.blocks[i];
        let at = meta.offset;
        // Lengths were bounded by the file geometry in open_structure.
        let bytes = self.read_at(
            at,
            BLOCK_CRC_LEN + meta.compressed_len as usize,
            "reading a block",
        )?;
        let Some((crc, frame)) = bytes.split_first_chunk::<BLOCK_CRC_LEN>() else {
            return Err(self.corrupt(at, format!("block {i} is shorter than its crc32c")));
        };
        let stored = fixed::u32_le_in::<0, BLOCK_CRC_LEN>(crc);
        let actual = crc32c::crc32c(frame);
        if stored != actual {
            return Err(self.corrupt(
                at,
                format!("block {i} crc32c {actual:08x} does not match the stored {stored:08x}"),
            ));
        }
        let raw = zstd::bulk::decompress(frame, meta.uncompressed_len as usize)
            .map_err(|e| self.corrupt(at, format!("block {i} does not decompress: {e}")))?;
        if raw.len() as u64 != meta.uncompressed_len {
            return Err(self.corrupt(
                at,
                format!(
                    "block {i} decompresses to {} bytes, the index says {}",
                    raw.len(),
                    meta.uncompressed_len
                ),
            ));
        }
        let rows = decode_rows(&raw, meta.rows, self.row_schema)
            .map_err(|e| self.corrupt(at, format!("block {i}: {e}")))?;
        self.check_block_rows(i, &rows)
            .map_err(|e| self.corrupt(at, format!("block {i}: {e}")))?;
        Ok(rows)
    }

    /// Invariants re-asserted after reading (TigerBeetle style).
    fn check_block_rows(&self, i: usize, rows: &[Row]) -> Result<(), Damage> {
        let meta = &self.blocks[i];
        let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
            return Err(Damage::NoRows);
        };
        if (first.namespace.as_str(), first.key.as_slice())
            != (meta.first_namespace.as_str(), meta.first_key.as_slice())
            || (last.namespace.as_str(), last.key.as_slice())
                != (meta.last_namespace.as_str(), meta.last_key.as_slice())
        {
            return Err(Damage::BlockKeys);
        }
        if rows
            .windows(2)
            .any(|w| w[0].order_key() >= w[1].order_key())
        {
            return Err(Damage::RowsUnsorted);
        }
        let ts_min = rows.iter().map(|r| r.ts).min().unwrap_or(0);
        let ts_max = rows.iter().map(|r| r.ts).max().unwrap_or(0);
        if (ts_min, ts_max) != (meta.ts_min, meta.ts_max) {
            return Err(Damage::BlockTsRange);
        }
        if let Some(r) = rows
            .iter()
            .find(|r| r.index < self.header.log_first || r.index > self.header.log_last)
        {
            return Err(Damage::RowOutsideLog { index: r.index });
        }
        Ok(())
    }

    /// Checks everything except block contents and the whole-file hash.
    fn open_structure(path: &Path, id: String) -> Result<Self> {
        let io = |op: &'static str| {
            move |source| Error::Io {
                file: path.to_owned(),
                op,
                source,
            }
        };
        let file = File::open(path).map_err(io("opening"))?;
        let file_len = file.metadata().map_err(io("reading metadata"))?.len();
        Self::from_source(path, Source::File(file), file_len, id)
    }

    fn from_source(path: &Path, file: Source, file_len: u64, id: String) -> Result<Self> {
        let corrupt = |offset: u64, what: String| Error::Corrupt {
            file: path.to_owned(),
            offset,
            what,
        };
        let prologue_len = (PROLOGUE_LEN as u64).min(file_len) as usize;
        let prologue = read_at(&file, path, 0, prologue_len, "reading the prologue")?;
        if prologue.len() < MAGIC.len() || prologue[..MAGIC.len()] != MAGIC {
            return Err(Error::BadMagic {
                file: path.to_owned(),
                found: prologue[..prologue.len().min(MAGIC.len())].to_vec(),
            });
        }
        if file_len < FILE_LEN_MIN {
            return Err(corrupt(
                0,
                format!("file of {file_len} bytes is too short (truncated?)"),
            ));
        }
        let prologue = fixed::array::<PROLOGUE_LEN>(&prologue, 0)
            .map_err(|e| corrupt(0, format!("prologue: {e}")))?;
        let version = fixed::u32_le_in::<PROLOGUE_VERSION_OFFSET, PROLOGUE_LEN>(prologue);
        if !(FORMAT_VERSION_MIN..=FORMAT_VERSION_MAX).contains(&version) {
            return Err(Error::UnknownVersion {
                file: path.to_owned(),
                version,
                supported: FORMAT_VERSION_MAX,
            });
        }
        let header_len =
            fixed::u32_le_in::<PROLOGUE_HEADER_LEN_OFFSET, PROLOGUE_LEN>(prologue) as usize;
        let header_end = (PROLOGUE_LEN + header_len) as u64;
        if header_len > HEADER_BYTES_MAX || header_end + TRAILER_LEN as u64 > file_len {
            return Err(corrupt(
                PROLOGUE_HEADER_LEN_OFFSET as u64,
                format!("header length {header_len} does not fit (file {file_len} bytes)"),
            ));
        }
        let header_bytes = read_at(
            &file,
            path,
            PROLOGUE_LEN as u64,
            header_len,
            "reading the header",
        )?;
        let header_crc = crc32c::crc32c_append(
            crc32c::crc32c(&prologue[..PROLOGUE_CRC_COVERED]),
            &header_bytes,
        );
        if header_crc != fixed::u32_le_in::<PROLOGUE_HEADER_CRC_OFFSET, PROLOGUE_LEN>(prologue) {
            return Err(corrupt(
                PROLOGUE_LEN as u64,
                "header crc32c mismatch".into(),
            ));
        }
        let header: HeaderV1 = ciborium::from_reader(header_bytes.as_slice()).map_err(|e| {
            corrupt(
                PROLOGUE_LEN as u64,
                format!("header is not valid CBOR: {e}"),
            )
        })?;

        let trailer_at = file_len - TRAILER_LEN as u64;
        let trailer = read_at(&file, path, trailer_at, TRAILER_LEN, "reading the trailer")?;
        let trailer = fixed::array::<TRAILER_LEN>(&trailer, 0)
            .map_err(|e| corrupt(trailer_at, format!("trailer: {e}")))?;
        if trailer[TRAILER_MAGIC_OFFSET..] != TRAILER_MAGIC {
            return Err(corrupt(
                trailer_at,
                "trailing magic missing (truncated or damaged)".into(),
            ));
        }
        if crc32c::crc32c(&trailer[..TRAILER_CRC_OFFSET])
            != fixed::u32_le_in::<TRAILER_CRC_OFFSET, TRAILER_LEN>(trailer)
        {
            return Err(corrupt(trailer_at, "trailer crc32c mismatch".into()));
        }
        let footer_offset = fixed::u64_le_in::<TRAILER_FOOTER_OFFSET_OFFSET, TRAILER_LEN>(trailer);
        let footer_len =
            fixed::u32_le_in::<TRAILER_FOOTER_LEN_OFFSET, TRAILER_LEN>(trailer) as usize;
        if footer_offset < header_end
            || footer_len > FOOTER_BYTES_MAX
            || footer_offset.checked_add(footer_len as u64) != Some(trailer_at)
        {
            return Err(corrupt(
                trailer_at,
                format!("footer [{footer_offset}, +{footer_len}) does not end at the trailer"),
            ));
        }
        let footer_bytes = read_at(&file, path, footer_offset, footer_len, "reading the footer")?;
        if crc32c::crc32c(&footer_bytes)
            != fixed::u32_le_in::<TRAILER_FOOTER_CRC_OFFSET, TRAILER_LEN>(trailer)
        {
            return Err(corrupt(footer_offset, "footer crc32c mismatch".into()));
        }
        let footer: FooterV1 = ciborium::from_reader(footer_bytes.as_slice())
            .map_err(|e| corrupt(footer_offset, format!("footer is not valid CBOR: {e}")))?;

        check_header(&header).map_err(|e| corrupt(PROLOGUE_LEN as u64, e.to_string()))?;
        check_footer(&header, &footer, header_end, footer_offset)
            .map_err(|e| corrupt(footer_offset, e.to_string()))?;
        let bloom =
            Bloom::from_stored(footer.bloom).map_err(|e| corrupt(footer_offset, e.to_string()))?;

        Ok(Self {
            path: path.to_owned(),
            file,
            file_len,
            id,
            header: SegmentHeader {
                tablet: header.tablet,
                vshard_lo: header.vshard_lo,
                vshard_hi: header.vshard_hi,
                log_first: header.log_first,
                log_last: header.log_last,
            },
            stats: SegmentStats {
                rows: header.rows,
                keys: header.keys,
                ts_min: header.ts_min,
                ts_max: header.ts_max,
            },
            blocks: footer.blocks,
            bloom,
            header_end,
            footer_offset,
            file_xxh3: fixed::u64_le_in::<TRAILER_FILE_XXH3_OFFSET, TRAILER_LEN>(trailer),
            row_schema: header.row_schema,
        })
    }

    /// The whole-file xxh3-64 stored in the trailer.
    pub fn file_xxh3(&self) -> u64 {
        self.file_xxh3
    }

    /// Offset of the footer (for tools and tests).
    pub fn footer_offset(&self) -> u64 {
        self.footer_offset
    }

    /// The byte ranges `(offset, len)` that opening reads: the prologue
    /// and header, then the footer and trailer. Holding these locally is
    /// enough to open the segment again without its blocks.
    pub fn structure_ranges(&self) -> [(u64, usize); 2] {
        [
            (0, self.header_end as usize),
            (
                self.footer_offset,
                (self.file_len - self.footer_offset) as usize,
            ),
        ]
    }

    /// Raw bytes `[offset, offset + len)` of the file, unchecked (the
    /// caller checks them, or keeps ranges the open already checked).
    pub fn raw_range(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        read_at(&self.file, &self.path, offset, len, "reading a raw range")
    }
}

fn check_id(id: &str) -> Result<()> {
    if id.len() != 32
        || !id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(Error::Invalid(format!(
            "segment id {id:?} is not 32 lowercase hex digits"
        )));
    }
    Ok(())
}

fn read_at(
    file: &Source,
    path: &Path,
    offset: u64,
    len: usize,
    op: &'static str,
) -> Result<Vec<u8>> {
    let read = match file {
        Source::File(f) => {
            let mut buf = vec![0; len];
            f.read_exact_at(&mut buf, offset).map(|()| buf)
        }
        Source::Remote(r) => r.read_at(offset, len).and_then(|buf| {
            if buf.len() == len {
                Ok(buf)
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "short remote read",
                ))
            }
        }),
    };
    read.map_err(|source| {
        if source.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Corrupt {
                file: path.to_owned(),
                offset,
                what: format!(
                    "file ends before {len} bytes at this offset while {op} (truncated?)"
                ),
            }
        } else {
            Error::Io {
                file: path.to_owned(),
                op,
                source,
            }
        }
    })
}

fn check_header(h: &HeaderV1) -> Result<(), Damage> {
    if !(ROW_SCHEMA_MIN..=ROW_SCHEMA).contains(&h.row_schema) {
        return Err(Damage::UnknownRowSchema {
            schema: h.row_schema,
        });
    }
    if u64::from(h.vshard_lo) >= h.vshard_hi || h.vshard_hi > 1 << 32 {
        return Err(Damage::VshardRange {
            lo: h.vshard_lo,
            hi: h.vshard_hi,
        });
    }
    if h.log_first > h.log_last
        || h.rows == 0
        || h.keys == 0
        || h.keys > h.rows
        || h.ts_min > h.ts_max
    {
        return Err(Damage::HeaderCounts);
    }
    Ok(())
}

/// The footer agrees with the header and the blocks tile `[header_end, footer_offset)`
/// in sorted order, so no byte of the file escapes a checksum.
fn check_footer(
    h: &HeaderV1,
    f: &FooterV1,
    header_end: u64,
    footer_offset: u64,
) -> Result<(), Damage> {
    if (f.rows, f.keys, f.ts_min, f.ts_max) != (h.rows, h.keys, h.ts_min, h.ts_max) {
        return Err(Damage::FooterStats);
    }
    if f.index_min < h.log_first || f.index_max > h.log_last || f.index_min > f.index_max {
        return Err(Damage::FooterIndexRange);
    }
    let (Some(first), Some(last)) = (f.blocks.first(), f.blocks.last()) else {
        return Err(Damage::NoBlocks);
    };
    if (first.first_namespace.as_str(), first.first_key.as_slice())
        != (f.first_namespace.as_str(), f.first_key.as_slice())
        || (last.last_namespace.as_str(), last.last_key.as_slice())
            != (f.last_namespace.as_str(), f.last_key.as_slice())
    {
        return Err(Damage::FooterKeys);
    }
    let mut expected = header_end;
    let mut rows = 0u64;
    let (mut ts_min, mut ts_max) = (u64::MAX, 0);
    for (i, b) in f.blocks.iter().enumerate() {
        if b.offset != expected {
            return Err(Damage::BlockGap {
                block: i,
                offset: b.offset,
                expected,
            });
        }
        if b.compressed_len == 0
            || b.uncompressed_len > BLOCK_UNCOMPRESSED_BYTES_MAX as u64
            || b.rows == 0
            || b.rows > b.uncompressed_len / ROW_BYTES_MIN
        {
            return Err(Damage::BlockSizes { block: i });
        }
        expected = b
            .offset
            .checked_add(BLOCK_CRC_LEN as u64 + b.compressed_len)
            .filter(|end| *end <= footer_offset)
            .ok_or(Damage::BlockPastFooter { block: i })?;
        let bfirst = (b.first_namespace.as_str(), b.first_key.as_slice());
        let blast = (b.last_namespace.as_str(), b.last_key.as_slice());
        if bfirst > blast || b.ts_min > b.ts_max {
            return Err(Damage::BlockReversed { block: i });
        }
        if i > 0 {
            let prev = &f.blocks[i - 1];
            if (prev.last_namespace.as_str(), prev.last_key.as_slice()) > bfirst {
                return Err(Damage::BlockOverlap { block: i });
            }
        }
        rows = rows.saturating_add(b.rows);
        ts_min = ts_min.min(b.ts_min);
        ts_max = ts_max.max(b.ts_max);
    }
    if expected != footer_offset {
        return Err(Damage::BlocksEnd {
            end: expected,
            footer_offset,
        });
    }
    if rows != h.rows || (ts_min, ts_max) != (h.ts_min, h.ts_max) {
        return Err(Damage::IndexTotals);
    }
    Ok(())
}
