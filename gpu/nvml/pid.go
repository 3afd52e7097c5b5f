package nvml

import "os"

func currentPID() int { return os.Getpid() }
