"""The lines of a corpus file or stream, read in pieces of bounded size, decoded and numbered.

Memory never grows with the length of a line. A line of a column format is at most
MAX_LINE_BYTES long (JSON Lines, one sentence per line: MAX_JSONL_LINE_BYTES), its line end
included: a longer one is refused (InputFormatError naming the file and the line) as soon as that
many bytes are read, so a file without line breaks (/dev/zero, a sparse file) costs a megabyte to
refuse, not its size. Raw text (`numbered_pieces`) has no such limit: a longer line comes in
consecutive pieces of at most MAX_LINE_BYTES.

Lines end in LF or CRLF (the CR is dropped). A CR anywhere else in a line of a column format is
refused: a file whose lines end in CR only (classic Mac OS) would read as one line, and a token
or label with a CR in it does not survive being written out. A NUL in a file or stream is refused
in every format: it is binary data, not text.
"""

from __future__ import annotations

import codecs
import errno
import io
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Union

from gpseq.errors import InputFormatError

Source = Union[str, os.PathLike, IO, Iterable]
MAX_LINE_BYTES = 1 << 20  # a line of CoNLL, CRF++ or CoNLL-U (one token), or a piece of raw text
# a line of JSON Lines holds a whole sentence, with the per-token label distributions that
# `gpseq tag --format jsonl` writes (a 1,000-token sentence with 70 labels is about 2 MB)
MAX_JSONL_LINE_BYTES = 16 << 20
CR_INSIDE = ("carriage return (CR) inside the line: lines end in LF or CRLF, not in CR alone (classic Mac OS "
             "line ends: convert them, e.g. tr '\\r' '\\n' < FILE)")


def source_name(source, name: str | None) -> str:
    """What errors call `source`: `name` when given, else its path or file name, else <stream>."""
    if name is not None:
        return name
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    return str(getattr(source, "name", "<stream>"))


def input_path_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be read as an input file (a directory, a symbolic link loop, missing), or
    None when it can: a file, a named pipe or a device (`<(zcat corpus.gz)`, /dev/stdin)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "symbolic link loop (too many levels of symbolic links)"
        if error.errno in (errno.ENOENT, errno.ENOTDIR):
            return "broken symbolic link (its target does not exist)" if os.path.islink(path) else "no such file"
        return error.strerror or str(error)
    return "is a directory, not a file" if stat.S_ISDIR(mode) else None


def text_codec(encoding: str, name: str) -> str:
    """The codec name of `encoding`; InputFormatError for an unknown one or one that is not a text
    encoding (rot13, base64, zlib: transforms that Python's codecs also hold)."""
    try:
        info = codecs.lookup(encoding)
    except LookupError:
        raise InputFormatError(name, None, f"unknown encoding {encoding!r}") from None
    if not getattr(info, "_is_text_encoding", True):
        raise InputFormatError(name, None, f"{encoding!r} is not a text encoding (it transforms bytes or text); "
                                           "give one such as utf-8, latin-1 or euc-jp")
    return info.name


def _ascii_compatible(encoding: str) -> bool:
    try:
        return "\n\r \t-#".encode(encoding) == b"\n\r \t-#"
    except (LookupError, UnicodeError):
        return False


def _handle_pieces(readline, size: int) -> Iterator[tuple[bytes | str, bool]]:
    """(piece, whether it ends its line) from `readline(size)` calls: each at most `size` bytes
    (characters from a text handle). A piece ends its line when it ends in LF or nothing follows."""
    piece = readline(size)
    while piece:
        if piece.endswith(b"\n" if isinstance(piece, bytes) else "\n"):
            yield piece, True
            piece = readline(size)
        else:
            following = readline(size)
            yield piece, not following
            piece = following


class _Pieces:
    """Decoded, numbered pieces of lines: iterating gives (line number, text, whether the piece ends
    its line), the line end (LF, CRLF) dropped from the last piece; `unit` is what the pieces are
    measured in (bytes; characters for an encoding decoded as a text stream, UTF-16/32).
    `from_stream`: whether the pieces come from a file or file object, where a NUL is binary data
    (str lines a program passes are its own text, as `gpseq serve` passes a request's)."""

    def __init__(self, raw: Iterable[tuple[bytes | str, bool]], name: str, encoding: str, codec: str,
                 unit: str, from_stream: bool):
        self.raw, self.name, self.encoding, self.unit = raw, name, encoding, unit
        self.from_stream = from_stream
        self.utf8 = codec in ("utf-8", "utf-8-sig")
        self.decode_as = "utf-8" if self.utf8 else encoding

    def _undecodable(self, number: int, err: UnicodeDecodeError, offset: int) -> InputFormatError:
        bad = err.object[err.start:err.end]
        return InputFormatError(self.name, number,
                                f"bytes {bad!r} at byte {offset + err.start + 1} are not valid {self.encoding}")

    def __iter__(self) -> Iterator[tuple[int, str, bool]]:
        number, offset, decoder = 1, 0, None  # offset: bytes of this line in earlier pieces
        starts = True  # whether the next piece starts its line
        try:
            for raw, last in self.raw:
                if not isinstance(raw, bytes):
                    text = raw
                elif last and decoder is None:  # a whole line in one piece: the common case
                    try:
                        text = raw.decode(self.decode_as)
                    except UnicodeDecodeError as err:
                        raise self._undecodable(number, err, 0) from None
                else:  # a line in several pieces: a character may straddle two of them
                    decoder = decoder or codecs.getincrementaldecoder(self.decode_as)()
                    held = len(decoder.getstate()[0])
                    try:
                        text = decoder.decode(raw, final=last)
                    except UnicodeDecodeError as err:
                        raise self._undecodable(number, err, offset - held) from None
                    offset += len(raw)
                if "\0" in text and (self.from_stream or isinstance(raw, bytes)):
                    raise InputFormatError(self.name, number, "a NUL byte: binary data, not text")
                if last:
                    if text.endswith("\n"):
                        text = text[:-1]
                    if text.endswith("\r"):
                        text = text[:-1]
                if number == 1 and starts and self.utf8 and text.startswith("\ufeff"):
                    text = text[1:]
                yield number, text, last
                starts = last
                if last:
                    number, offset, decoder = number + 1, 0, None
        except UnicodeError as err:  # from a text stream's decoder (UTF-16 without a byte-order mark …)
            reason = err.reason if isinstance(err, UnicodeDecodeError) else str(err)
            raise InputFormatError(self.name, number, f"not valid {self.encoding}: {reason}") from None

    def lines(self, limit: int) -> Iterator[tuple[int, str]]:
        """(line number, line) of a column format: InputFormatError for a line longer than `limit`
        (its line end included) or with a CR inside it."""
        for number, text, last in self:
            if "\r" in (text if last else text[:-1]):  # a partial line's last CR may be its CRLF's
                raise InputFormatError(self.name, number, CR_INSIDE)
            if not last:
                raise InputFormatError(self.name, number, f"line longer than {limit:,} {self.unit}, the longest a "
                                                          "line of this format may be (a file without line breaks?)")
            yield number, text


@contextmanager
def _open_pieces(source: Source, encoding: str, name: str | None, size: int):
    """Yield a `_Pieces` of `source`: a path, a binary or text file object (read by `readline(size)`),
    or an iterable of str/bytes lines (each taken whole)."""
    name = source_name(source, name)
    codec = text_codec(encoding, name)
    if isinstance(source, (str, os.PathLike)):
        problem = input_path_problem(source)
        if problem is not None:
            raise InputFormatError(name, None, problem)
        if _ascii_compatible(encoding):
            with open(Path(source), "rb") as handle:
                yield _Pieces(_handle_pieces(handle.readline, size), name, encoding, codec, "bytes", True)
        else:  # UTF-16/32: LF is not the byte 0x0A, so decode as a stream; lines end at LF only
            with open(Path(source), encoding=encoding, newline="\n") as handle:
                yield _Pieces(_handle_pieces(handle.readline, size), name, encoding, codec, "characters", True)
    elif isinstance(source, (str, bytes)):
        raise TypeError("pass a path, a file object or an iterable of lines, not a bare string")
    elif hasattr(source, "readline"):
        unit = "characters" if isinstance(source, io.TextIOBase) else "bytes"
        yield _Pieces(_handle_pieces(source.readline, size), name, encoding, codec, unit, True)
    else:  # lines a program holds, each taken whole
        pieces = ((line, True) for line in source)
        yield _Pieces(pieces, name, encoding, codec, "characters", False)


@contextmanager
def numbered_lines(source: Source, encoding: str = "utf-8", name: str | None = None, *,
                   max_line_bytes: int = MAX_LINE_BYTES):
    """Yield (name, iterator of (1-based line number, line without its line end)) for a column format.

    `source` is a path, a binary or text file object, or any iterable of str/bytes lines. Bytes
    are decoded line by line, so an undecodable byte is reported with its line number. A line of a
    file longer than `max_line_bytes` (line end included) is refused once that much is read, as is
    a CR inside a line and a NUL byte in a file (InputFormatError naming the file and the line).
    """
    with _open_pieces(source, encoding, name, max_line_bytes) as pieces:
        yield pieces.name, pieces.lines(max_line_bytes)


@contextmanager
def numbered_pieces(source: Source, encoding: str = "utf-8", name: str | None = None, *,
                    piece_bytes: int = MAX_LINE_BYTES):
    """Yield (name, iterator of (1-based line number, piece, whether the piece ends its line)) for
    raw text: a line longer than `piece_bytes` comes in consecutive pieces of at most that many bytes
    (a multi-byte character is never split), so memory is bounded whatever the line. A NUL byte in a
    file is refused; a CR is kept (raw text reads it as white space)."""
    with _open_pieces(source, encoding, name, piece_bytes) as pieces:
        yield pieces.name, iter(pieces)
