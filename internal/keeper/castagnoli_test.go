package keeper

import "hash/crc32"

// castagnoli is hash/crc32's CRC32C table. The tests compute the checksums
// they expect with hash/crc32, apart from internal/crc32c, which the
// package's code uses.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)
