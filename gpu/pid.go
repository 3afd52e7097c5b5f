package gpu

import "os"

func currentPID() int { return os.Getpid() }
