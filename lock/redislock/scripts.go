package redislock

import (
	"crypto/sha1"
	"encoding/hex"

	"github.com/onceguard/onceguard/lock/internal/redisscript"
)

// The scripts, and what they keep in which key, are in package
// redisscript, shared with lock/rueidislock: both speak the same protocol.

type script struct {
	src, sha string
	// The same as command arguments, boxed once rather than per command.
	srcArg, shaArg any
}

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	s := &script{src: src, sha: hex.EncodeToString(sum[:])}
	s.srcArg, s.shaArg = s.src, s.sha
	return s
}

var (
	scriptAcquire = newScript(redisscript.Acquire)
	scriptRelease = newScript(redisscript.Release)
	scriptRefresh = newScript(redisscript.Refresh)
	scriptLeave   = newScript(redisscript.Leave)
	scriptRaise   = newScript(redisscript.Raise)
	scriptReseed  = newScript(redisscript.Reseed)
)
