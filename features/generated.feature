@fake-coderd @generated
Feature: Generated provisioners
  Specs no one hand-picked, drawn from the space the contract describes: names short, at the
  63-character limit and past it; the organization given, empty or absent; key names in any case
  and up to 64 characters; each case on one documented limit, one under it or one past it (the
  name at 62 to 65 characters, and where its default key Secret name reaches 253 and 254; the key
  name at 63 to 65; the key Secret's name and data key at 253 and 254; a grace period and
  replicas of 0), where a value past an admission limit must be refused before the case goes on
  at the limit; most cases meeting one coderd answer out of the ordinary when they are first
  applied or when they change (a 429, a 500, 502, 503 or 504, a reset connection or a slow answer,
  once on each of the organization lookup and a key's create, list, delete and own lookup,
  whichever the operator calls), after which they must settle all the same; some cases on other
  coderds of the same host (other ports, their own ids for the scenario's organizations, another
  default organization, another release), started there or moved there by a change of control
  plane or by their control plane's URL moving there, where no organization id of one coderd may
  be sent to another and a replaced key must be deleted where it was applied; tags added and removed; other Secrets and data keys; replicas from 0;
  extraEnv of every source, optional references to absent Secrets; resources, pull Secrets and
  grace periods; the control plane's own entitlement check fresh or stale. Each case must settle, and after every scenario the contract oracle holds the
  settled CR, its children and its key in coderd to its spec. Each case then changes once, and
  its key requests must fit what the change can justify. A failure names its seed; the same seed
  gives the same case (`conformance run --name 'seed 5'`).

  @R-KEY-20 @R-SEC-7 @R-ST-4 @R-ST-7 @R-KEY-4 @R-KEY-15 @R-ENT-1 @D-4 @R-CRD-6 @extended
  Scenario Outline: The provisioner generated from seed <seed> settles as its spec says, before and after a change
    Given a Ready control plane with operator access
    And the scenario has a second coderd organization
    And a second Ready control plane "other-control-plane" with its own operator token
    When the provisioner generated from seed <seed> is applied
    # checks: D-4, R-CRD-6
    Then the API server admitted the generated provisioner at its limit and refused it past the limit
    # checks: R-KEY-20, R-SEC-7, R-ST-4, R-KEY-4, R-ST-7
    And the generated provisioner settles
    When the generated provisioner or its control plane is changed as its seed says
    # checks: R-KEY-20, R-SEC-7, R-ST-4, R-KEY-4, R-ST-7, R-KEY-15
    Then the generated provisioner settles
    # checks: R-KEY-15
    And the key the change replaced is gone from where it was applied
    # checks: R-KEY-4
    And coderd saw only the key requests the generated change justifies
    # checks: R-ENT-1
    And coderd saw no entitlements request when the control plane's recent check settles it

    Examples:
      | seed |
      | 1    |
      | 2    |
      | 3    |
      | 4    |
      | 5    |
      | 6    |
      | 7    |
      | 8    |
      | 9    |
      | 10   |
      | 11   |
      | 12   |
      | 13   |
      | 14   |
      | 15   |
