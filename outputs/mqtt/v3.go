package mqtt

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pahov3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/mdag/mdag/outputs"
)

// conn3 is an MQTT 3.1.1 connection: a paho.mqtt.golang client that does
// not reconnect on its own (the next Send makes a new one) and keeps no
// messages across connections.
type conn3 struct {
	client pahov3.Client
	qos    byte
	wait   time.Duration // bounds a Publish call (the client's write timeout)

	lost     chan struct{} // closed when the connection is lost
	lostOnce sync.Once
	lostMu   sync.Mutex
	lostErr  error

	feeders sync.WaitGroup // the goroutines calling Publish
}

// connReturnCodes names MQTT 3.1.1's CONNACK return codes.
var connReturnCodes = map[byte]string{
	1: "unacceptable protocol version",
	2: "identifier rejected",
	3: "server unavailable",
	4: "bad user name or password",
	5: "not authorized",
}

func (t *Transport) connect3(ctx context.Context) (conn, error) {
	c := &conn3{qos: t.qos, lost: make(chan struct{}), wait: t.c.ConnectTimeout}
	timeout := t.c.ConnectTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if timeout <= 0 {
		return nil, fmt.Errorf("mqtt: connect to %s: %w", t.addr, context.DeadlineExceeded)
	}
	o := pahov3.NewClientOptions()
	if t.tls {
		o.AddBroker("ssl://" + t.addr)
		if t.c.TLS != nil {
			o.SetTLSConfig(t.c.TLS)
		}
	} else {
		o.AddBroker("tcp://" + t.addr)
	}
	o.SetProtocolVersion(4) // 3.1.1, no fallback to 3.1
	o.SetClientID(t.c.ClientID)
	o.SetUsername(t.c.Username)
	o.SetPassword(t.c.Password)
	o.SetCleanSession(t.c.CleanSession)
	o.SetKeepAlive(t.c.KeepAlive)
	o.SetPingTimeout(min(t.c.KeepAlive, 10*time.Second))
	o.SetConnectTimeout(timeout)
	o.SetWriteTimeout(c.wait)
	o.SetAutoReconnect(false)
	o.SetConnectRetry(false)
	o.SetResumeSubs(false)
	o.SetStore(pahov3.NewMemoryStore())
	o.SetConnectionLostHandler(func(_ pahov3.Client, err error) {
		c.lostMu.Lock()
		c.lostErr = err
		c.lostMu.Unlock()
		c.lostOnce.Do(func() { close(c.lost) })
	})
	c.client = pahov3.NewClient(o)
	tok := c.client.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		// the attempt ends within timeout; Close waits for it so that no
		// goroutine outlives the Transport
		t.linger.Add(1)
		go func() {
			defer t.linger.Done()
			<-tok.Done()
			c.client.Disconnect(0)
		}()
		return nil, fmt.Errorf("mqtt: connect to %s: %w", t.addr, ctx.Err())
	}
	if err := tok.Error(); err != nil {
		c.client.Disconnect(0)
		// (return codes above 5 are paho's own, for network and protocol
		// errors, not the broker's)
		if ct, ok := tok.(*pahov3.ConnectToken); ok {
			if name, ok := connReturnCodes[ct.ReturnCode()]; ok {
				return nil, fmt.Errorf("mqtt: %s refused the connection: CONNACK return code %d (%s)", t.addr, ct.ReturnCode(), name)
			}
		}
		return nil, fmt.Errorf("mqtt: connect to %s: %w", t.addr, err)
	}
	return c, nil
}

func (c *conn3) alive() bool {
	select {
	case <-c.lost:
		return false
	default:
		return c.client.IsConnectionOpen()
	}
}

func (c *conn3) close() {
	c.client.Disconnect(0)
	c.feeders.Wait()
}

func (c *conn3) failure(what string) error {
	c.lostMu.Lock()
	defer c.lostMu.Unlock()
	if c.lostErr != nil {
		return fmt.Errorf("mqtt: %s: connection lost: %w", what, c.lostErr)
	}
	return fmt.Errorf("mqtt: %s: connection lost", what)
}

// publish hands the batch to the client in order from a goroutine (a
// Publish call may block up to the write timeout, Send may not) and waits
// for the tokens in order; at most maxInFlight are outstanding.
func (c *conn3) publish(ctx context.Context, batch []outputs.Message, topics []string) (int, error) {
	tokens := make(chan pahov3.Token, maxInFlight-1)
	stop := make(chan struct{})
	defer close(stop)
	c.feeders.Add(1)
	go func() {
		defer c.feeders.Done()
		defer close(tokens)
		for i, m := range batch {
			select {
			case <-stop:
				return
			default:
			}
			tok := c.client.Publish(topics[i], c.qos, m.Retain, m.Body)
			select {
			case tokens <- tok:
			case <-stop:
				return
			}
		}
	}()
	for i := range batch {
		what := fmt.Sprintf("publish message %d of %d", i+1, len(batch))
		var tok pahov3.Token
		select {
		case tok = <-tokens:
		case <-ctx.Done():
			return i, fmt.Errorf("mqtt: %s: %w", what, ctx.Err())
		case <-c.lost:
			return i, c.failure(what)
		}
		select {
		case <-tok.Done():
		case <-ctx.Done():
			return i, fmt.Errorf("mqtt: %s: waiting for PUBACK: %w", what, ctx.Err())
		case <-c.lost:
			select {
			case <-tok.Done():
			default:
				return i, c.failure(what)
			}
		}
		if err := tok.Error(); err != nil {
			if errors.Is(err, pahov3.ErrNotConnected) {
				return i, c.failure(what)
			}
			return i, fmt.Errorf("mqtt: %s: %w", what, err)
		}
	}
	return len(batch), nil
}
