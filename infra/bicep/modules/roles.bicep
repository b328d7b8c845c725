// Data-plane roles of one identity on the storage account (and, if given, the right to
// send email through Communication Services).

param storageName string
param principalId string
@description('Role definition ids to grant on the storage account.')
param storageRoles array
@description('Communication Services resource id; empty: none.')
param communicationId string = ''

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageName
}

resource grants 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for role in storageRoles: {
  name: guid(storage.id, principalId, role)
  scope: storage
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role)
  }
}]

resource communication 'Microsoft.Communication/communicationServices@2023-04-01' existing = if (!empty(communicationId)) {
  name: last(split(empty(communicationId) ? 'none' : communicationId, '/'))
}

// Contributor on the Communication Services resource: send email with an Entra ID token
resource mail 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(communicationId)) {
  name: guid(communicationId, principalId, 'mail')
  scope: communication
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'b24988ac-6180-42a0-ab88-20f7382dd24c')
  }
}
