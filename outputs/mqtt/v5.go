package mqtt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session"
	"github.com/eclipse/paho.golang/paho/session/state"

	"github.com/mdag/mdag/outputs"
)

// reasonPacketTooLarge is MQTT 5's reason code 0x95.
const reasonPacketTooLarge = 0x95

// conn5 is an MQTT 5 connection: a paho.Client over one network
// connection, with its own session state (a publisher keeps nothing
// across connections: the runner sends what was not acknowledged again).
//
// Publishes go out with paho's PublishMethod_AsyncSend, which returns once
// the packet is written, so they are written in order, and up to
// maxInFlight (or the broker's Receive Maximum) wait for their PUBACKs at
// once. paho gives no way to learn an async publish's outcome, so
// ackSession, wrapping the session state, hands the state a channel of its
// own for each PUBLISH and keeps it for publish to wait on.
type conn5 struct {
	nc      net.Conn
	client  *paho.Client
	sess    *ackSession
	maxSize uint32 // the broker's maximum packet size (0: none announced)
	// poisoned: the write deadline was set to the past (Send's ctx ended)
	poisoned atomic.Bool
	qos      byte

	mu      sync.Mutex
	lastErr error // why the connection ended (client error, server DISCONNECT)
	discon  byte  // the reason code of a server DISCONNECT (0: none)
}

// ackSession is paho's in-memory session state that keeps the response
// channel of the last PUBLISH added (see conn5).
type ackSession struct {
	*state.State
	last chan packets.ControlPacket // set by AddToSession, read by the same goroutine after PublishWithOptions
}

func (s *ackSession) AddToSession(ctx context.Context, p session.Packet, resp chan<- packets.ControlPacket) error {
	if p.Type() != packets.PUBLISH {
		return s.State.AddToSession(ctx, p, resp)
	}
	ch := make(chan packets.ControlPacket, 1) // the state sends one response (a zero one when the session closes)
	if err := s.State.AddToSession(ctx, p, ch); err != nil {
		return err
	}
	s.last = ch
	return nil
}

func (t *Transport) connect5(ctx context.Context) (conn, error) {
	nc, err := t.dial(ctx)
	if err != nil {
		return nil, err
	}
	c := &conn5{nc: nc, qos: t.qos, sess: &ackSession{State: state.NewInMemory()}}
	c.client = paho.NewClient(paho.ClientConfig{
		ClientID:      t.c.ClientID,
		Conn:          packets.NewThreadSafeConn(nc),
		Session:       c.sess,
		PacketTimeout: t.c.ConnectTimeout,
		OnServerDisconnect: func(d *paho.Disconnect) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.discon = d.ReasonCode
			reason := ""
			if d.Properties != nil && d.Properties.ReasonString != "" {
				reason = ": " + d.Properties.ReasonString
			}
			c.lastErr = fmt.Errorf("broker disconnected: %s%s", reasonName(d.ReasonCode), reason)
		},
		OnClientError: func(err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.lastErr == nil {
				c.lastErr = err
			}
		},
		// no subscriptions: a PUBLISH from the broker is dropped
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(paho.PublishReceived) (bool, error) { return true, nil }},
	})
	cp := &paho.Connect{
		ClientID:   t.c.ClientID,
		KeepAlive:  uint16(t.c.KeepAlive.Seconds()),
		CleanStart: t.c.CleanSession,
		Properties: &paho.ConnectProperties{},
	}
	if !t.c.CleanSession {
		exp := uint32(sessionExpiry)
		cp.Properties.SessionExpiryInterval = &exp
	}
	if t.c.Username != "" {
		cp.Username, cp.UsernameFlag = t.c.Username, true
	}
	if t.c.Password != "" {
		cp.Password, cp.PasswordFlag = []byte(t.c.Password), true
	}
	ca, err := c.client.Connect(ctx, cp)
	if err != nil {
		// paho closes the network connection and its goroutines on a failed Connect
		_ = c.sess.Close()
		if ca != nil && ca.ReasonCode >= 0x80 {
			reason := ""
			if ca.Properties != nil && ca.Properties.ReasonString != "" {
				reason = ": " + ca.Properties.ReasonString
			}
			return nil, fmt.Errorf("mqtt: %s refused the connection: CONNACK %s%s", t.addr, reasonName(ca.ReasonCode), reason)
		}
		return nil, fmt.Errorf("mqtt: connect to %s: %w", t.addr, err)
	}
	if ca.Properties != nil && ca.Properties.MaximumPacketSize != nil {
		c.maxSize = *ca.Properties.MaximumPacketSize
	}
	if t.qos > 0 && ca.Properties != nil && ca.Properties.MaximumQoS != nil && *ca.Properties.MaximumQoS < t.qos {
		c.close()
		return nil, fmt.Errorf("mqtt: %s supports QoS %d at most, want %d", t.addr, *ca.Properties.MaximumQoS, t.qos)
	}
	return c, nil
}

func (c *conn5) alive() bool {
	if c.poisoned.Load() {
		return false
	}
	select {
	case <-c.client.Done():
		return false
	default:
		return true
	}
}

func (c *conn5) close() {
	select {
	case <-c.client.Done():
	default:
		// a broker that reads nothing does not hold the DISCONNECT
		_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		_ = c.client.Disconnect(&paho.Disconnect{ReasonCode: 0})
	}
	<-c.client.Done()
	// the client does not close a session it did not make: closing it
	// answers the PUBLISHes still waiting with a zero packet
	_ = c.sess.Close()
}

// failure is the error for a connection that went away.
func (c *conn5) failure(what string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastErr != nil {
		return fmt.Errorf("mqtt: %s: connection lost: %w", what, c.lastErr)
	}
	return fmt.Errorf("mqtt: %s: connection lost", what)
}

func (c *conn5) publish(ctx context.Context, batch []outputs.Message, topics []string) (int, error) {
	// paho's writes take no context: when ctx ends, a write blocked on a
	// broker that reads nothing fails (and the connection with it)
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetWriteDeadline(time.Unix(1, 0)) })
	defer func() {
		if !stop() {
			c.poisoned.Store(true)
		}
	}()
	type pending struct {
		i  int
		ch chan packets.ControlPacket
	}
	var window []pending
	acked := 0
	// wait waits for the oldest pending PUBACK; an error ends the Send.
	wait := func() error {
		p := window[0]
		var resp packets.ControlPacket
		select {
		case resp = <-p.ch:
		case <-ctx.Done():
			return fmt.Errorf("mqtt: waiting for PUBACK of message %d of %d: %w", p.i+1, len(batch), ctx.Err())
		case <-c.client.Done():
			select {
			case resp = <-p.ch: // acked before the connection went
			default:
				if c.serverDisconnect() == reasonPacketTooLarge {
					return outputs.Permanent("mqtt: message %s (%d bytes): the broker disconnected: packet too large (0x95)", batch[p.i].ID, len(batch[p.i].Body))
				}
				return c.failure(fmt.Sprintf("waiting for PUBACK of message %d of %d", p.i+1, len(batch)))
			}
		}
		if resp.Type != packets.PUBACK {
			return c.failure(fmt.Sprintf("waiting for PUBACK of message %d of %d", p.i+1, len(batch)))
		}
		pa := resp.Content.(*packets.Puback)
		if pa.ReasonCode >= 0x80 {
			if pa.ReasonCode == reasonPacketTooLarge {
				return outputs.Permanent("mqtt: message %s (%d bytes): broker refused it: packet too large (0x95)", batch[p.i].ID, len(batch[p.i].Body))
			}
			return fmt.Errorf("mqtt: message %s: broker refused it: PUBACK %s", batch[p.i].ID, reasonName(pa.ReasonCode))
		}
		window = window[1:]
		acked = p.i + 1
		return nil
	}
	for i, m := range batch {
		pub := &paho.Publish{
			QoS:     c.qos,
			Retain:  m.Retain,
			Topic:   topics[i],
			Payload: m.Body,
			Properties: &paho.PublishProperties{
				ContentType:   "application/json",
				PayloadFormat: new(byte(1)),
				User:          paho.UserProperties{{Key: "id", Value: m.ID}},
			},
		}
		if c.maxSize > 0 {
			// the packet's size: PacketID is 0 now, 2 bytes either way
			if n, err := pub.Packet().WriteTo(io.Discard); err == nil && uint64(n) > uint64(c.maxSize) {
				// the ones in flight first: acked must end at this message
				// (the one the caller drops)
				for len(window) > 0 {
					if err := wait(); err != nil {
						return acked, err
					}
				}
				return acked, outputs.Permanent("mqtt: message %s: %d bytes, over the broker's maximum packet size %d", m.ID, n, c.maxSize)
			}
		}
		if len(window) >= maxInFlight {
			if err := wait(); err != nil {
				return acked, err
			}
		}
		c.sess.last = nil
		_, err := c.client.PublishWithOptions(ctx, pub, paho.PublishOptions{Method: paho.PublishMethod_AsyncSend})
		if err != nil {
			if errors.Is(err, paho.ErrInvalidArguments) {
				return acked, fmt.Errorf("mqtt: message %s: %w", m.ID, err)
			}
			// what was acked before still counts
		drain:
			for len(window) > 0 {
				select {
				case resp := <-window[0].ch:
					pa, ok := resp.Content.(*packets.Puback)
					if !ok || pa.ReasonCode >= 0x80 {
						break drain
					}
					acked = window[0].i + 1
					window = window[1:]
				default:
					break drain
				}
			}
			if ctx.Err() != nil {
				return acked, fmt.Errorf("mqtt: publish message %d of %d: %w", i+1, len(batch), ctx.Err())
			}
			return acked, c.failure(fmt.Sprintf("publish message %d of %d (%v)", i+1, len(batch), err))
		}
		if c.qos == 0 {
			acked = i + 1
			continue
		}
		window = append(window, pending{i, c.sess.last})
	}
	for len(window) > 0 {
		if err := wait(); err != nil {
			return acked, err
		}
	}
	return acked, nil
}

func (c *conn5) serverDisconnect() byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.discon
}

// reasonName names an MQTT 5 reason code: "not authorized (0x87)".
func reasonName(code byte) string {
	name, ok := reasonNames[code]
	if !ok {
		name = "reason"
	}
	return fmt.Sprintf("%s (0x%02X)", name, code)
}

var reasonNames = map[byte]string{
	0x00: "success",
	0x04: "disconnect with will message",
	0x10: "no matching subscribers",
	0x80: "unspecified error",
	0x81: "malformed packet",
	0x82: "protocol error",
	0x83: "implementation specific error",
	0x84: "unsupported protocol version",
	0x85: "client identifier not valid",
	0x86: "bad user name or password",
	0x87: "not authorized",
	0x88: "server unavailable",
	0x89: "server busy",
	0x8A: "banned",
	0x8B: "server shutting down",
	0x8C: "bad authentication method",
	0x8D: "keep alive timeout",
	0x8E: "session taken over",
	0x90: "topic name invalid",
	0x93: "receive maximum exceeded",
	0x94: "topic alias invalid",
	0x95: "packet too large",
	0x96: "message rate too high",
	0x97: "quota exceeded",
	0x98: "administrative action",
	0x99: "payload format invalid",
	0x9A: "retain not supported",
	0x9B: "QoS not supported",
	0x9C: "use another server",
	0x9D: "server moved",
	0x9F: "connection rate exceeded",
}
