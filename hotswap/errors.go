package hotswap

import "errors"

// ErrConfig is wrapped by every error [New] returns for a bad [Config].
var ErrConfig = errors.New("hotswap: bad configuration")
